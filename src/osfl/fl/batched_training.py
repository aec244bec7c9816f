"""Batched clients: many clients of one architecture trained as one step.

One-shot methods start from N clients that train the same small model from
the same weights on their own data (docs/design.md §2). Trained one by one on a
CPU, a small CNN at batch 64 spends most of each step in per-operator
overhead, not arithmetic. Here the N models' parameters are stacked along a
new leading dimension and every step runs the whole federation through
:func:`torch.func.functional_call` under :func:`torch.func.vmap`, so each
operator runs once on N clients' batches.

The result equals :func:`osfl.fl.training.train_local` run per client, up to
float tolerance (the batched kernels sum in another order):

- each client keeps its own seeded loader and augmentation generator, drawn
  in the same order as its sequential run, so batches and augmentations are
  the same (off the CPU, the device generator its sequential run derives:
  :func:`~osfl.data.transforms.augmentation_generator`);
- clients whose next batch is shorter (the end of an epoch, ``drop_last``
  off) run in their own vmap group of that size, so BatchNorm statistics only
  ever see a client's real samples: no padding, no masks;
- every optimizer in :data:`osfl.fl.optim.OPTIMIZERS` is elementwise, so one
  optimizer over the stacked parameters updates each client exactly as its own
  optimizer would; gradient clipping is per client;
- a client with fewer steps (less data, epochs-based training) is copied out
  when it takes its last step; the stacked copy may go on moving, unused.

It applies when a model has no active dropout (a different random mask per
client would not match a sequential run), the objective is plain
cross-entropy (no objective terms, no custom loss), and, for a schedule that
is not constant, every client takes the same number of steps (the schedule is
one for all). :func:`batchable` says why not otherwise.

**Why a loop of its own** (osfl has two image-training loops, this one and
:func:`~osfl.fl.training.train_local`; tensors train in
:func:`osfl.fl.tensor_fit.fit`): a step here is one vmapped forward and one
optimizer step over N clients' stacked parameters, with clipping per client,
which no per-client loop can express, and its kernels sum in another order, so
folding one loop into the other would change the numbers of the one folded.
It is a driver over what ``train_local`` is built from: the same loader
(:func:`osfl.data.loader.client_loader`), optimizer and schedule registries
(:mod:`osfl.fl.optim`), and statistics (:class:`osfl.fl.train_stats.StepTally`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from osfl.data.loader import client_loader
from osfl.data.transforms import augmentation_generator
from osfl.errors import ConfigError
from osfl.fl.optim import build_optimizer, build_schedule, is_constant_schedule
from osfl.fl.train_config import TrainConfig
from osfl.fl.train_stats import StepTally, TrainStats

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform

__all__ = ["BatchedResult", "batchable", "train_batched"]


@dataclass
class BatchedResult:
    """One client's outcome: its trained state dict (on ``device``), its
    :class:`TrainStats` and the label batch of every local step, in order."""

    state: dict[str, torch.Tensor]
    stats: TrainStats
    step_labels: list[torch.Tensor]


def batchable(model: nn.Module, cfg: TrainConfig, sizes: Sequence[int]) -> str | None:
    """Why clients of ``model`` holding ``sizes`` samples cannot train batched
    with ``cfg`` (``None``: they can)."""
    if len(sizes) < 2:
        return "fewer than two clients"
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"{name or 'model'} has dropout (p={m.p}): its masks would differ per run"
    if not is_constant_schedule(cfg) and len({cfg.total_steps(n) for n in sizes}) > 1:
        return "the lr schedule is not constant and the clients take different numbers of steps"
    return None


def _client_batches(
    data: ImageSet, cfg: TrainConfig, generator: torch.Generator, device: torch.device, total: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The client's ``total`` batches, epoch after epoch, exactly as :func:`train_local` draws them."""
    loader = client_loader(data, cfg.batch_size, cfg.drop_last, generator, device)
    step = 0
    while step < total:
        for batch in loader:
            yield batch
            step += 1
            if step >= total:
                return


def _clip_per_client(params: Sequence[torch.Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` for each client's slice of the stacked gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.ndim - 1))))


@dataclass
class _Stack:
    """N copies of one model's parameters and buffers along a new leading
    dimension, and the vmapped forward that runs any group of them at once."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    keys: list[str]  # persistent entries, in the order loaders expect
    trainable: list[torch.Tensor]
    n: int
    device: torch.device
    vmapped: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

    @classmethod
    def of(cls, model: nn.Module, n: int, device: torch.device) -> _Stack:
        """Stack ``n`` copies of ``model``'s current weights (already on ``device``)."""
        params = {
            k: v.detach().unsqueeze(0).repeat(n, *([1] * v.ndim)).requires_grad_(v.requires_grad)
            for k, v in model.named_parameters()
        }
        buffers = {
            k: v.detach().unsqueeze(0).repeat(n, *([1] * v.ndim)) for k, v in model.named_buffers()
        }

        def forward(p: dict, b: dict, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
            b = dict(b)  # BatchNorm updates its running statistics in place: return them
            out = functional_call(model, (p, b), (x,))
            return out, b

        return cls(
            params=params,
            buffers=buffers,
            keys=list(model.state_dict()),
            trainable=[p for p in params.values() if p.requires_grad],
            n=n,
            device=device,
            vmapped=vmap(forward),
        )

    def forward(self, members: list[int], x: torch.Tensor) -> torch.Tensor:
        """Logits of the clients ``members`` on their stacked batches ``x``.

        A group short of the whole federation runs on a selected copy of the
        stack, so its BatchNorm statistics are written back into the stack."""
        whole = len(members) == self.n
        # non-blocking: a blocking host-to-device copy would wait for the GPU
        index = None if whole else torch.tensor(members).to(self.device, non_blocking=True)
        p = self.params if whole else {k: v.index_select(0, index) for k, v in self.params.items()}
        b = (
            self.buffers
            if whole
            else {k: v.index_select(0, index) for k, v in self.buffers.items()}
        )
        logits, new_buffers = self.vmapped(p, b, x)
        with torch.no_grad():
            for k, v in new_buffers.items():
                if v.data_ptr() != self.buffers[k].data_ptr():  # a whole group updated in place
                    self.buffers[k].index_copy_(0, index, v)
        return logits

    def state_of(self, i: int) -> dict[str, torch.Tensor]:
        """Client ``i``'s state dict, copied out of the stack."""
        stacked = {**self.params, **self.buffers}
        return {k: stacked[k][i].detach().clone() for k in self.keys}


def train_batched(
    model: nn.Module,
    datas: Sequence[ImageSet],
    cfg: TrainConfig,
    generators: Sequence[torch.Generator],
    *,
    transform: Transform | None = None,
    device: torch.device | str = "cpu",
) -> list[BatchedResult]:
    """Train one copy of ``model`` (its current weights) per data set in ``datas``.

    ``generators[i]`` is client i's generator, as :func:`train_local` would
    get it (batch order and augmentations). Raises :class:`ConfigError` when
    :func:`batchable` says no. ``model`` itself is not changed.
    """
    device = torch.device(device)
    sizes = [len(d) for d in datas]
    _refuse_unbatchable(model, cfg, sizes, len(generators))
    n = len(datas)
    stack = _Stack.of(model.to(device).train(), n, device)
    totals = [cfg.total_steps(s) for s in sizes]
    optimizer = build_optimizer(stack.trainable, cfg)
    schedule = None if is_constant_schedule(cfg) else build_schedule(optimizer, cfg, totals[0])
    streams, tallies = _client_streams(datas, generators, cfg, device, totals)
    labels: list[list[torch.Tensor]] = [[] for _ in range(n)]
    augment = [augmentation_generator(g, device) for g in generators]
    results: dict[int, BatchedResult] = {}
    start = time.perf_counter()
    for step in range(max(totals)):
        active = [i for i in range(n) if step < totals[i]]
        batches = _draw(active, streams, augment, transform)
        loss = _step_loss(stack, batches, tallies, step)
        for i, (_, yb) in batches.items():
            labels[i].append(yb)
        _update(optimizer, schedule, loss, stack.trainable, cfg.grad_clip)
        for i in active:
            if step + 1 == totals[i]:
                epochs = totals[i] / max(cfg.batches_per_epoch(sizes[i]), 1)
                results[i] = BatchedResult(
                    state=stack.state_of(i),
                    stats=tallies[i].stats(totals[i], epochs, time.perf_counter() - start),
                    step_labels=labels[i],
                )
    return [results[i] for i in range(n)]


def _refuse_unbatchable(
    model: nn.Module, cfg: TrainConfig, sizes: Sequence[int], n_generators: int
) -> None:
    """A :class:`ConfigError` before any work when :func:`batchable` says no or
    a client has no generator."""
    why = batchable(model, cfg, sizes)
    if why is not None:
        raise ConfigError(f"clients cannot train batched: {why}")
    if n_generators != len(sizes):
        raise ConfigError(f"{len(sizes)} data sets but {n_generators} generators")


def _client_streams(
    datas: Sequence[ImageSet],
    generators: Sequence[torch.Generator],
    cfg: TrainConfig,
    device: torch.device,
    totals: Sequence[int],
) -> tuple[list[Iterator[tuple[torch.Tensor, torch.Tensor]]], list[StepTally]]:
    """Each client's batch stream (its own loader and generator, as in its
    sequential run) and the tally that keeps its statistics."""
    streams = [
        _client_batches(d, cfg, g, device, t)
        for d, g, t in zip(datas, generators, totals, strict=True)
    ]
    sizes = [len(d) for d in datas]
    per_epoch = [min(cfg.batches_per_epoch(s), t) for s, t in zip(sizes, totals, strict=True)]
    tallies = [StepTally(t, e, device) for t, e in zip(totals, per_epoch, strict=True)]
    return streams, tallies


def _draw(
    active: list[int],
    streams: Sequence[Iterator[tuple[torch.Tensor, torch.Tensor]]],
    generators: Sequence[torch.Generator | None],
    transform: Transform | None,
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each active client's next (augmented input, label) batch, drawn client
    by client so every generator advances as in its sequential run."""
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in active:
        xb, yb = next(streams[i])
        x = transform(xb, generators[i]) if transform is not None else xb.float() / 255
        batches[i] = (x, yb)
    return batches


def _step_loss(
    stack: _Stack,
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]],
    tallies: Sequence[StepTally],
    step: int,
) -> torch.Tensor:
    """The sum over clients of each one's mean cross-entropy (its gradient is
    each client's own), run as one vmap group per batch size so no client's
    BatchNorm sees padding; each client's tally records its loss."""
    groups: dict[int, list[int]] = {}
    for i, (_, yb) in batches.items():
        groups.setdefault(yb.shape[0], []).append(i)
    loss = torch.zeros((), device=stack.device)
    for members in groups.values():
        x = torch.stack([batches[i][0] for i in members])
        y = torch.stack([batches[i][1] for i in members])
        logits = stack.forward(members, x)
        per_client = (
            F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
            .view(len(members), -1)
            .mean(1)
        )
        loss = loss + per_client.sum()
        for j, i in enumerate(members):
            tallies[i].add(step, per_client[j].detach(), logits[j].detach(), batches[i][1])
    return loss


def _update(
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler | None,
    loss: torch.Tensor,
    trainable: Sequence[torch.Tensor],
    grad_clip: float | None,
) -> None:
    """One optimizer (and schedule) step on the stacked parameters, clipped per client."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        _clip_per_client(trainable, grad_clip)
    optimizer.step()
    if schedule is not None:
        schedule.step()
