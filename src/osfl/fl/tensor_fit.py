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

import copy
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig, build_optimizer, build_schedule
from osfl.fl.progress import Progress

__all__ = ["FitConfig", "fit"]

#: ``loss_fn(model, *batch) -> scalar loss`` for one batch of the aligned tensors.
BatchLoss = Callable[..., torch.Tensor]
#: ``score(model) -> value`` after an epoch (higher is better): selection by validation.
EpochScore = Callable[[nn.Module], float]
#: Which epoch's weights :func:`fit` leaves in the model without a ``score``.
KEEPS = ("last", "lowest_loss")


@dataclass(frozen=True)
class FitConfig(OptimConfig):
    """One training recipe: the optimizer of :class:`~osfl.fl.optim.OptimConfig`
    (its fields, names and checks; only the defaults differ: Adam at 5e-4, the
    frozen-encoder papers' choice) plus ``epochs`` passes over the tensors in
    shuffled batches of ``batch_size`` (schedule per step). ``keep``: the
    weights left at the end, the ``last`` epoch's or those of the epoch with
    the ``lowest_loss`` (mean training loss; FALCON's authors keep their
    generator this way). ``amp`` (mixed precision, ``train.amp``'s name) runs
    each batch's forward pass under :func:`torch.autocast` in bfloat16, on a
    CPU too (the loss functions cast their results to float32): 1.56× per
    FALCON generator step on a CPU with AVX-512 BF16 at the same loss curve
    (BENCHMARKS.md); off by default, since it changes results in their last
    digits. It was ``autocast: bfloat16|none`` (osfl.config.hints)."""

    optimizer: str = "adam"
    lr: float = 5e-4
    #: passes over the training tensors
    epochs: int = 60
    #: samples per step
    batch_size: int = 256
    #: the weights left at the end: the last epoch's, or the lowest_loss epoch's
    keep: str = "last"
    #: mixed precision: the forward pass under torch.autocast in bfloat16 (on CPU too)
    amp: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()  # the optimizer fields: OptimConfig's checks
        if self.keep not in KEEPS:
            raise ConfigError(f"keep must be one of {', '.join(KEEPS)}; got {self.keep!r}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")


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
    score: EpochScore | None = None,
) -> list[float]:
    """Train ``model`` in place; returns the mean loss of every epoch.

    ``tensors`` are aligned along dim 0 and moved to ``device`` once;
    ``generator`` (a CPU generator) fixes the batch order, so a run is
    reproducible. The model is left in eval mode with the weights of the
    epoch ``cfg.keep`` names, or with ``score`` (called in eval mode after
    every epoch) those of the first epoch with the highest score.
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
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, cfg)
    per_epoch = math.ceil(n / cfg.batch_size)
    schedule = build_schedule(optimizer, cfg, cfg.epochs * per_epoch)
    losses: list[float] = []
    best = _BestEpoch()
    autocast: Callable[[], AbstractContextManager[Any]] = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if cfg.amp else nullcontext
    )
    task = (progress or Progress()).task(description, cfg.epochs)
    # dropout draws from the global RNG: seed it from ``generator`` inside a fork
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=_forked_devices(device)), task:
        torch.manual_seed(seed)
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator).to(device)
            total = torch.zeros((), device=device)
            for i in range(0, n, cfg.batch_size):
                idx = order[i : i + cfg.batch_size]
                with autocast():
                    loss = loss_fn(model, *(t[idx] for t in data))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
                schedule.step()
                total += loss.detach() * len(idx)
            losses.append(float(total) / n)
            best.offer(model, _epoch_value(model, losses[-1], cfg.keep, score))
            task.advance()
    best.restore(model)
    model.eval()
    return losses


def _forked_devices(device: torch.device) -> list[torch.device]:
    """The accelerators whose random state :func:`fit` forks with the CPU's
    (``torch.random.fork_rng``), so that its seeded dropout leaves the
    caller's streams as they were: a GPU's, none on the CPU."""
    return [device] if device.type == "cuda" else []


def _epoch_value(
    model: nn.Module, loss: float, keep: str, score: EpochScore | None
) -> float | None:
    """The value an epoch is kept by (higher is better), ``None`` for ``last``."""
    if score is not None:
        model.eval()
        with torch.no_grad():
            value = float(score(model))
        model.train()
        return value
    return -loss if keep == "lowest_loss" else None


class _BestEpoch:
    """The weights of the best epoch so far (the first of equals)."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.state: dict[str, torch.Tensor] | None = None

    def offer(self, model: nn.Module, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        if self.value is None or value > self.value:
            self.value = value
            self.state = copy.deepcopy(model.state_dict())

    def restore(self, model: nn.Module) -> None:
        if self.state is not None:
            model.load_state_dict(self.state)
