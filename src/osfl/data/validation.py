"""A validation set carved from a run's train set (``data.validation_fraction``).

Held out before the clients' split, so no client trains on it; a method
that chooses among its own candidates (``ServerValidation``) and every
evaluation's ``validation_accuracy`` read it, so that no choice is made on
test accuracy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from osfl.data.imageset import DataSplits


def carve_validation(splits: DataSplits, fraction: float, seed: int) -> DataSplits:
    """``splits`` with ``fraction`` of each class of the train set (rounded
    half up, at least one where a class has two samples or more) moved to a
    validation set, drawn with ``seed`` (the caller seeds it by the data
    alone, so that every run seed and every method sees the same samples)."""
    labels = splits.train.labels.numpy()
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n = min(len(idx) - 1, max(1, int(np.floor(fraction * len(idx) + 0.5))))
        held.append(np.sort(rng.choice(idx, size=n, replace=False)) if n > 0 else idx[:0])
    val = np.sort(np.concatenate(held))
    keep = np.setdiff1d(np.arange(len(labels)), val)
    return dataclasses.replace(
        splits, train=splits.train.subset(keep), validation=splits.train.subset(val)
    )
