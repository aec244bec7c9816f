"""EFTViT's median sampling: a balanced patch-features (BPF) set per client.

EFTViT §3.4: the threshold m is the median of the client's class counts;
*minority* classes (n_c < m) keep the patch features of **every** local
epoch, *majority* classes (n_c >= m) those of the **last** epoch only; then
every class is downsampled to m. The server thus sees the same number of
features for every class the client holds, not the client's label
proportions. Fig. 7 tries higher thresholds than the median: ``quantile``.

Our choices where the paper is silent (docs/methods/eftvit.md):

- m is the ``quantile`` (0.5 = median) of the client's **non-zero** class
  counts (an absent class is not a class the client holds), linear
  interpolation, rounded half up, at least 1;
- a minority class whose features from all epochs are still fewer than m
  (``n_c * E < m``) is **padded** to m by drawing its own features again
  with replacement (``pad=True``, default), so every class the client holds
  uploads exactly m features and the uploaded histogram is flat; with
  ``pad=False`` it uploads what it has (fewer than m: the server then learns
  that the class is rare);
- an absent class uploads nothing: the server still learns *which* classes a
  client holds (the support of its label distribution), not how many of each;
- downsampling draws without replacement; every random draw comes from the
  client's seeded generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from osfl.errors import ConfigError


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def sampling_threshold(class_counts: Sequence[int] | np.ndarray, quantile: float = 0.5) -> int:
    """m: the ``quantile`` of the non-zero class counts, rounded half up (>= 1)."""
    counts = np.asarray(class_counts, dtype=np.int64)
    present = counts[counts > 0]
    if present.size == 0:
        raise ConfigError("median sampling needs at least one sample")
    if not 0.0 <= quantile <= 1.0:
        raise ConfigError(f"quantile must lie in [0, 1], got {quantile}")
    return max(1, round_half_up(float(np.quantile(present, quantile))))


@dataclass(frozen=True)
class SamplingPlan:
    """What median sampling does with one client's classes.

    ``counts``: the client's samples per class; ``threshold``: m;
    ``minority``: classes with ``0 < n_c < m``; ``available``: features each
    class collects (``n_c * epochs`` for minority classes, ``n_c`` otherwise);
    ``uploaded``: features each class uploads.
    """

    counts: tuple[int, ...]
    epochs: int
    threshold: int
    pad: bool
    minority: tuple[bool, ...]
    available: tuple[int, ...]
    uploaded: tuple[int, ...]

    @property
    def num_features(self) -> int:
        return sum(self.uploaded)


def plan_sampling(
    class_counts: Sequence[int] | np.ndarray,
    epochs: int,
    quantile: float = 0.5,
    pad: bool = True,
) -> SamplingPlan:
    """The :class:`SamplingPlan` of a client with these class counts."""
    if epochs < 1:
        raise ConfigError(f"epochs must be >= 1, got {epochs}")
    counts = tuple(int(n) for n in class_counts)
    m = sampling_threshold(counts, quantile)
    minority = tuple(0 < n < m for n in counts)
    available = tuple(n * epochs if low else n for n, low in zip(counts, minority, strict=True))
    uploaded = tuple(
        0 if n == 0 else (m if pad else min(a, m)) for n, a in zip(counts, available, strict=True)
    )
    return SamplingPlan(counts, epochs, m, pad, minority, available, uploaded)


def _pick(n_available: int, n_wanted: int, generator: torch.Generator) -> torch.Tensor:
    """Indices: a random subset when there are enough, else every index once
    plus draws with replacement up to ``n_wanted`` (padding)."""
    order = torch.randperm(n_available, generator=generator)
    if n_wanted <= n_available:
        return order[:n_wanted]
    extra = torch.randint(n_available, (n_wanted - n_available,), generator=generator)
    return torch.cat([order, extra])


def median_sample(
    features: Sequence[torch.Tensor],
    labels: Sequence[torch.Tensor],
    epochs: Sequence[int],
    class_counts: Sequence[int] | np.ndarray,
    *,
    num_epochs: int,
    quantile: float = 0.5,
    pad: bool = True,
    generator: torch.Generator,
) -> tuple[dict[int, torch.Tensor], SamplingPlan]:
    """The balanced patch-features set of one client.

    ``features[i]`` (B_i × ...) and ``labels[i]`` are the batch of local step
    i, ``epochs[i]`` its epoch (0-based, of ``num_epochs``); ``class_counts``
    the client's samples per class. Returns ``{class: features (n, ...)}`` for
    every class it holds, and the plan (thresholds, counts before/after).
    """
    if not (len(features) == len(labels) == len(epochs)):
        raise ConfigError("features, labels and epochs must have one entry per step")
    plan = plan_sampling(class_counts, num_epochs, quantile, pad)
    feats = torch.cat([f.to("cpu") for f in features])
    ys = torch.cat([y.to("cpu") for y in labels])
    ep = torch.cat(
        [
            torch.full((len(y),), int(e), dtype=torch.int64)
            for y, e in zip(labels, epochs, strict=True)
        ]
    )
    last = num_epochs - 1
    out: dict[int, torch.Tensor] = {}
    for c, n in enumerate(plan.counts):
        if n == 0:
            continue
        mask = ys == c if plan.minority[c] else (ys == c) & (ep == last)
        pool = torch.nonzero(mask).flatten()
        if pool.numel() == 0:
            continue  # the class never appeared in a step (e.g. dropped by drop_last)
        wanted = plan.uploaded[c] if pad else min(pool.numel(), plan.threshold)
        out[c] = feats[pool[_pick(pool.numel(), wanted, generator)]]
    return out, plan
