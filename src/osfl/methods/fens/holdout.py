"""FENS's held-out split: each client keeps a share of its data away from its
own model's training, and only that share's logits train the aggregator.

As the authors do it (``sacs-epfl/fens`` a349903, ``datasets/DataPartitioner.py``
lines 46–55, ``--proxy_ratio 0.1`` in ``scripts/local_training.sh``): the
client's ``floor(fraction · n)`` held-out samples are drawn by a seeded random
permutation, the rest is its training set. Seeded by the run seed and the
client id only, so the client draws the same split in the round it trains its
model and in the round it computes the logits.
"""

from __future__ import annotations

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.fl.seeds import derive_seed

__all__ = ["holdout_indices", "split_client_data"]


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)``: sorted indices into ``range(n)``. ``floor(fraction · n)``
    are held out (the authors' ``int()``), at least one when ``fraction > 0``
    and ``n >= 2`` (a client of fewer than ten samples would otherwise hold none
    out); ``fraction = 0``: no split, both are all of ``range(n)``."""
    if fraction <= 0:
        every = np.arange(n, dtype=np.int64)
        return every, every
    held = int(n * fraction)
    if held == 0 and n >= 2:
        held = 1
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    return np.sort(perm[: n - held]), np.sort(perm[n - held :])


def split_client_data(
    data: ImageSet, fraction: float, run_seed: int, client: int
) -> tuple[ImageSet, ImageSet]:
    """``(train, held_out)`` of one client's data (see :func:`holdout_indices`);
    with ``fraction = 0`` both are ``data`` itself."""
    if fraction <= 0:
        return data, data
    seed = derive_seed(run_seed, client, "fens-holdout")
    train, held = holdout_indices(len(data), fraction, seed)
    return data.subset(train), data.subset(held)
