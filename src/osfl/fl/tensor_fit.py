"""Mini-batch training on in-memory tensors (tokens, features, sequences).

The frozen-encoder methods train small models — FALCON's generator and
classifiers, FedPFT's linear head — on tensors, not on images, so they use
this loop instead of :func:`osfl.fl.training.train_local` (which batches
uint8 ImageSets through image transforms); so does the token-inversion
attack's decoder (:mod:`osfl.privacy.token_inversion`), which is why the loop
lives here, below both methods and privacy. The optimizer and schedule come
from the registries of local training (:mod:`osfl.fl.optim`), so a config
names them the same way (``adam``, ``adamw``, ``cosine`` …).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig, build_optimizer, build_schedule
from osfl.fl.progress import Progress

__all__ = ["FitConfig", "fit"]

#: ``loss_fn(model, *batch) -> scalar loss`` for one batch of the aligned tensors.
BatchLoss = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class FitConfig:
    """One training recipe: ``epochs`` passes over the tensors in shuffled
    batches of ``batch_size`` with ``optimizer`` at ``lr`` (schedule per step)."""

    #: passes over the training tensors
    epochs: int = 60
    #: samples per step
    batch_size: int = 256
    #: adam, adamw, sgd, ... (the names of train.optimizer)
    optimizer: str = "adam"
    #: learning rate
    lr: float = 5e-4
    #: weight decay
    weight_decay: float = 0.0
    #: learning-rate schedule per step (constant, cosine, ...)
    schedule: str = "constant"
    #: clip the gradient norm to this value (null: no clipping)
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        self.optim()  # the optimizer fields are OptimConfig's: checked once, there

    def optim(self) -> OptimConfig:
        return OptimConfig(
            optimizer=self.optimizer,
            lr=self.lr,
            weight_decay=self.weight_decay,
            schedule=self.schedule,
            grad_clip=self.grad_clip,
        )


def fit(
    model: nn.Module,
    tensors: Sequence[torch.Tensor],
    loss_fn: BatchLoss,
    cfg: FitConfig,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    description: str = "training",
) -> list[float]:
    """Train ``model`` in place; returns the mean loss of every epoch.

    ``tensors`` are aligned along dim 0 and moved to ``device`` once;
    ``generator`` (a CPU generator) fixes the batch order, so a run is
    reproducible. The model is left in eval mode.
    """
    n = int(tensors[0].shape[0])
    if n == 0:
        raise ConfigError(f"{description}: nothing to train on (0 samples)")
    if any(int(t.shape[0]) != n for t in tensors):
        raise ConfigError(
            f"{description}: tensors of different lengths {[len(t) for t in tensors]}"
        )
    device = torch.device(device)
    data = [t.to(device) for t in tensors]
    model.to(device).train()
    ocfg = cfg.optim()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, ocfg)
    per_epoch = math.ceil(n / cfg.batch_size)
    schedule = build_schedule(optimizer, ocfg, cfg.epochs * per_epoch)
    losses: list[float] = []
    task = (progress or Progress()).task(description, cfg.epochs)
    # dropout draws from the global RNG: seed it from ``generator`` inside a fork
    forked = [device] if device.type == "cuda" else []
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=forked), task:
        torch.manual_seed(seed)
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator).to(device)
            total = torch.zeros((), device=device)
            for i in range(0, n, cfg.batch_size):
                idx = order[i : i + cfg.batch_size]
                loss = loss_fn(model, *(t[idx] for t in data))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                schedule.step()
                total += loss.detach() * len(idx)
            losses.append(float(total) / n)
            task.advance()
    model.eval()
    return losses
