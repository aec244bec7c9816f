"""EFTViT's server side: train the global module and the head on the uploaded
patch features (§3.5, Eq. 3–4): cross-entropy over the balanced patch-feature
sets of the round's participants, the global module taking the local
modules' tokens as input.

The recipe (:class:`ServerTrainConfig`) follows the paper's optimiser (§4.2:
AdamW, weight decay 0.05); the number of server epochs per round and the
learning rate are not in our copy of the paper: one epoch over the round's
features and lr 1e-4 are our defaults (docs/methods/eftvit.md). A fresh
optimiser per round, like the clients'.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig, build_optimizer, build_schedule, is_constant_schedule
from osfl.fl.progress import Progress


@dataclass(frozen=True)
class ServerTrainConfig(OptimConfig):
    """The server's optimiser (AdamW, wd 0.05) plus ``epochs`` over the round's
    features, ``batch_size`` and ``amp`` (bf16 autocast on CUDA)."""

    optimizer: str = "adamw"
    lr: float = 1e-4
    weight_decay: float = 0.05
    #: server epochs over each round's uploaded features
    epochs: int = 1
    #: features per server step
    batch_size: int = 32
    #: bf16 autocast on CUDA (no effect on CPU)
    amp: bool = True

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as e:
            raise ConfigError(f"server: {e}") from None
        if self.epochs < 1:
            raise ConfigError(f"server: epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"server: batch_size must be >= 1, got {self.batch_size}")


def train_global_module(
    top: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    cfg: ServerTrainConfig,
    *,
    device: torch.device,
    generator: torch.Generator,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train ``top`` (global module + head: tokens -> logits) in place on
    ``features`` (N × T × D) and ``labels``; returns steps and mean loss."""
    if len(features) != len(labels) or len(labels) == 0:
        raise ConfigError(
            f"server training needs N > 0 features with N labels, got "
            f"{len(features)} and {len(labels)}"
        )
    top.to(device).train()
    for p in top.parameters():
        p.requires_grad_(True)
    n, bs = len(labels), cfg.batch_size
    total = cfg.epochs * math.ceil(n / bs)
    optimizer = build_optimizer(top.parameters(), cfg)
    schedule = None if is_constant_schedule(cfg) else build_schedule(optimizer, cfg, total)
    use_amp = cfg.amp and device.type == "cuda" and torch.cuda.is_bf16_supported()
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_amp else nullcontext
    loss_sum = torch.zeros((), device=device)
    with (progress or Progress()).task("eftvit: server training", total) as bar:
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator)
            for i in range(0, n, bs):
                idx = order[i : i + bs]
                x, y = features[idx].to(device), labels[idx].to(device)
                with autocast():
                    loss = F.cross_entropy(top(x).float(), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(top.parameters(), cfg.grad_clip)
                optimizer.step()
                if schedule is not None:
                    schedule.step()
                loss_sum += loss.detach()
                bar.advance()
    return {"steps": total, "samples": n, "mean_loss": float(loss_sum) / total}
