"""FENS's aggregator and one client's training of it.

The aggregator is the authors' ``SmallNN`` (``sacs-epfl/fens`` a349903,
``models/smallnn.py`` lines 6–15): ``fc2(relu(fc1(x)))`` over the K client
models' logits concatenated in client order (``torch.hstack`` in
``generate_logits_v2.py`` line 227), ``fc1``: K·C → K·d, ``fc2``: K·d → C,
with ``d = 2`` (``scripts/train_aggregator.sh``, ``--d 2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from osfl.fl.method import Predictor
from osfl.fl.optim import build_optimizer, build_schedule, is_constant_schedule
from osfl.methods.fens.config import AggregatorLocalConfig

__all__ = ["FENSPredictor", "LogitAggregator", "samples_seen", "train_aggregator"]


class LogitAggregator(nn.Module):
    """``g``: the K members' logits (B×K×C) to class scores (B×C)."""

    def __init__(self, members: int, classes: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(1),
            nn.Linear(members * classes, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return self.net(logits)


class FENSPredictor(Predictor):
    """The aggregator over the client models' logits."""

    def __init__(self, members: Sequence[nn.Module], aggregator: LogitAggregator):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.aggregator = aggregator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.aggregator(torch.stack([m(x).float() for m in self.members], dim=1))


def train_aggregator(
    aggregator: LogitAggregator,
    logits: torch.Tensor,
    labels: torch.Tensor,
    cfg: AggregatorLocalConfig,
    generator: torch.Generator,
) -> None:
    """``cfg.steps`` optimiser steps of cross-entropy on batches of the client's
    held-out ``logits`` (n×K×C) and ``labels``: successive batches of a random
    order, a new order when one is used up (the authors draw a fresh shuffled
    loader every round and take its first ``steps`` batches)."""
    opt = build_optimizer(aggregator.parameters(), cfg)
    sched = None if is_constant_schedule(cfg) else build_schedule(opt, cfg, cfg.steps)
    aggregator.train()
    n = len(labels)
    order, pos = torch.randperm(n, generator=generator), 0
    for _ in range(cfg.steps):
        if pos >= n:
            order, pos = torch.randperm(n, generator=generator), 0
        idx = order[pos : pos + cfg.batch_size]
        pos += cfg.batch_size
        loss = F.cross_entropy(aggregator(logits[idx]), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(aggregator.parameters(), cfg.grad_clip)
        opt.step()
        if sched is not None:
            sched.step()


def samples_seen(n: int, cfg: AggregatorLocalConfig) -> int:
    """The weight of a client's aggregator in the round's mean: the samples its
    steps saw, ``min(n, batch_size · steps)`` (``train_LocalSGD.py``'s
    ``get_ratios``, lines 435–446, for steps counted in iterations)."""
    return min(n, cfg.batch_size * cfg.steps)
