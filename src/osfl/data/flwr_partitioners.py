"""The helpers every partition scheme shares around ``flwr_datasets``
(Flower Datasets, Beutel et al., "Flower: A Friendly Federated Learning
Research Framework", arXiv:2007.14390): seeds, the labels as a tiny
``datasets.Dataset`` with an ``index`` column, running a partitioner with its
``ValueError``\\ s turned into :class:`~osfl.errors.DataError`, the checks of
a scheme's parameters, and the Dirichlet split two schemes use.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import numbers
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from osfl.data.partition_base import PartitionData
from osfl.errors import DataError

if TYPE_CHECKING:
    import datasets
    from flwr_datasets.partitioner import Partitioner

log = logging.getLogger(__name__)


def _seeds(seed: int, n: int) -> list[int]:
    """``n`` independent 32-bit seeds from one user seed (shuffle, partitioner, ...)."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def _table(data: PartitionData, shuffle_seed: int | None) -> datasets.Dataset:
    """The labels (and domains) as a Dataset with an ``index`` column.

    Rows are permuted up front (as ``FederatedDataset`` shuffles before
    partitioning) so that contiguous partitioners (IID, size) draw random
    samples; permuting the arrays, not ``Dataset.shuffle``, avoids an indices
    mapping that makes every later column read slow.
    """
    # heavy: datasets (~1.5 s; only a partition that runs needs it)
    import datasets

    n = data.num_samples
    order = (
        np.arange(n, dtype=np.int64)
        if shuffle_seed is None
        else np.random.default_rng(shuffle_seed).permutation(n).astype(np.int64)
    )
    cols: dict[str, np.ndarray] = {"label": data.labels[order], "index": order}
    if data.domains is not None:
        cols["domain"] = data.domains[order]
    return datasets.Dataset.from_dict(cols)


def _indices(part: datasets.Dataset) -> np.ndarray:
    """The ``index`` column of a partition (Arrow format: ~50x faster than numpy format)."""
    return np.asarray(part.with_format("arrow")["index"].to_numpy(), dtype=np.int64)


def _run(
    partitioner: Partitioner, table: datasets.Dataset, num_parts: int, what: str, hint: str
) -> list[np.ndarray]:
    """Assign ``table`` to ``partitioner`` and load every partition's indices.

    Flower signals failure with ``ValueError`` (after a bounded number of
    retries for Dirichlet) and progress with warnings / tqdm on stderr; both are
    turned into a DataError or a log line here.
    """
    partitioner.dataset = table
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("always")
        try:
            out = [_indices(partitioner.load_partition(i)) for i in range(num_parts)]
        except ValueError as e:
            msg = f"{what} split failed ({str(e).strip()})"
            raise DataError(msg + (f"; {hint}" if hint else "")) from None
    if caught:
        log.debug(
            "%s: flwr_datasets warned %d time(s); last: %s", what, len(caught), caught[-1].message
        )
    return out


def _check_real(name: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DataError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise DataError(
            f"{name} must be > 0 (small = more skewed, large = closer to IID), got {value}"
        )
    return float(value)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise DataError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_min_size(num_samples: int, num_parts: int, min_size: int, where: str = "") -> None:
    """The impossible case, refused before Flower spends its retries on it."""
    if num_parts * min_size > num_samples:
        raise DataError(
            f"{num_parts} clients x min_partition_size={min_size} needs {num_parts * min_size} "
            f"samples but {where or 'the data'} has {num_samples}; use fewer clients or a "
            "smaller min_partition_size"
        )


def _dirichlet(
    table: datasets.Dataset, num_parts: int, alpha: float, min_size: int, balance: bool, seed: int
) -> list[np.ndarray]:
    # heavy: flwr_datasets (imports datasets, ~2 s)
    from flwr_datasets.partitioner import DirichletPartitioner

    p = DirichletPartitioner(
        num_partitions=num_parts,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_size,
        self_balancing=balance,
        shuffle=False,
        seed=seed,
    )
    hint = (
        f"with alpha={alpha}, {num_parts} clients and min_partition_size={min_size}, "
        "use a larger alpha, fewer clients or a smaller min_partition_size"
    )
    return _run(p, table, num_parts, "dirichlet", hint)
