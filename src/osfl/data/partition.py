"""Federated partitions: split a train set's labels into per-client index sets.

The schemes wrap ``flwr_datasets.partitioner`` (Flower Datasets, Beutel et al.,
"Flower: A Friendly Federated Learning Research Framework", arXiv:2007.14390)
rather than rewrite it: the labels (and domains) become a tiny
``datasets.Dataset`` with an ``index`` column, the partitioner's
``load_partition(i)`` is called for every client, and the ``index`` column maps
its rows back to positions in the train set.

Schemes (registry :data:`PARTITIONS`):

- ``iid``: a seeded shuffle, then ``IidPartitioner``'s equal contiguous shards.
- ``dirichlet``: per class, proportions p ~ Dir(alpha) over clients (Yurochkin
  et al., "Bayesian Nonparametric Federated Learning of Neural Networks",
  ICML 2019; the ``p_k ~ Dir(alpha)`` split of FedMITR, DENSE, Co-Boosting, FAFI),
  via ``DirichletPartitioner``; resampled by Flower until every client holds
  ``min_partition_size`` samples (at most 11 draws, then an error).
- ``pathological``: ``#C=k``, each client holds exactly ``k`` classes (Li et al.,
  "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022),
  via ``PathologicalPartitioner``.
- ``natural_id``: one client per domain (``NaturalIdPartitioner`` on the domain
  column, e.g. OfficeHome's four domains); with ``alpha``, ``clients_per_domain``
  clients per domain split by ``DirichletPartitioner`` inside each domain.
- ``quantity_skew``: IID labels, client sizes ~ Dir(beta) over clients (Li et al.
  2022 again), each at least ``min_partition_size``, via ``SizePartitioner``.

Every bad parameter is refused up front with an :class:`~osfl.errors.DataError`
that says what to change; Flower's own ``ValueError``\\ s (e.g. a Dirichlet split
that cannot reach ``min_partition_size``) are re-raised the same way, so no
split ever loops or ends in a bare traceback.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import numbers
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from osfl.data.federation import Federation, as_label_array, federation_key, fingerprint_labels
from osfl.errors import ConfigError, DataError
from osfl.registry import Registry

if TYPE_CHECKING:
    import datasets
    from flwr_datasets.partitioner import Partitioner

log = logging.getLogger(__name__)

__all__ = ["PARTITIONS", "Federation", "PartitionData", "Scheme", "make_federation"]


@dataclass(frozen=True)
class PartitionData:
    """What a scheme reads: int64 labels, optional int64 domains, the class count."""

    labels: np.ndarray
    domains: np.ndarray | None
    num_classes: int

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])


class Scheme(ABC):
    """A partition scheme: a frozen dataclass of its parameters plus ``split``.

    ``check`` refuses impossible requests before any work; ``split`` returns one
    index array per client (unsorted is fine; :class:`Federation` sorts).
    """

    uses_domains: ClassVar[bool] = False

    def check(self, data: PartitionData, num_clients: int) -> None:  # noqa: B027
        """Raise DataError for a request this scheme cannot satisfy (default: none)."""

    @abstractmethod
    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]: ...


PARTITIONS: Registry[type[Scheme]] = Registry("partition scheme")


# ---- helpers around flwr_datasets ----------------------------------------------------
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


# ---- schemes ---------------------------------------------------------------------------
@PARTITIONS.register("iid")
@dataclass(frozen=True)
class Iid(Scheme):
    """Uniformly random, equal-size clients (sizes differ by at most one)."""

    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]:
        # heavy: flwr_datasets (imports datasets, ~2 s)
        from flwr_datasets.partitioner import IidPartitioner

        table = _table(data, _seeds(seed, 1)[0])
        return _run(IidPartitioner(num_clients), table, num_clients, "iid", "")


@PARTITIONS.register("dirichlet")
@dataclass(frozen=True)
class Dirichlet(Scheme):
    """Per class, client proportions ~ Dir(alpha); every sample is used once.

    ``self_balancing`` (Flower's option, from the original code of Yurochkin et
    al.) stops giving samples to clients already above the mean size.
    """

    alpha: float = 0.5
    min_partition_size: int = 2
    self_balancing: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_real("alpha", self.alpha))
        object.__setattr__(
            self, "min_partition_size", _check_int("min_partition_size", self.min_partition_size, 0)
        )
        if not isinstance(self.self_balancing, bool):
            raise DataError(f"self_balancing must be true or false, got {self.self_balancing!r}")

    def check(self, data: PartitionData, num_clients: int) -> None:
        _check_min_size(data.num_samples, num_clients, self.min_partition_size)

    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]:
        shuffle_seed, part_seed = _seeds(seed, 2)
        return _dirichlet(
            _table(data, shuffle_seed),
            num_clients,
            self.alpha,
            self.min_partition_size,
            self.self_balancing,
            part_seed,
        )


_ASSIGNMENTS = ("random", "first-deterministic", "deterministic")


@PARTITIONS.register("pathological")
@dataclass(frozen=True)
class Pathological(Scheme):
    """``#C=k``: each client holds exactly ``classes_per_client`` classes.

    A class's samples are split evenly among the clients holding it. With
    ``class_assignment="random"`` (FedMITR's "k random classes for each client")
    a class no client drew is left out of the federation; ``first-deterministic``
    (the Li et al. 2022 code) gives client ``c`` class ``c mod K`` first, so
    every class is used once ``num_clients >= K``.
    """

    classes_per_client: int = 2
    class_assignment: str = "random"

    def __post_init__(self) -> None:
        k = _check_int("classes_per_client", self.classes_per_client, 1)
        object.__setattr__(self, "classes_per_client", k)
        if self.class_assignment not in _ASSIGNMENTS:
            raise DataError(
                f"class_assignment must be one of {', '.join(_ASSIGNMENTS)}, "
                f"got {self.class_assignment!r}"
            )

    def check(self, data: PartitionData, num_clients: int) -> None:
        present = np.unique(data.labels)
        if self.classes_per_client > present.size:
            raise DataError(
                f"classes_per_client={self.classes_per_client} but only {present.size} classes "
                f"occur in the labels; use classes_per_client <= {present.size}"
            )

    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]:
        # heavy: flwr_datasets (imports datasets, ~2 s)
        from flwr_datasets.partitioner import PathologicalPartitioner

        shuffle_seed, part_seed = _seeds(seed, 2)
        p = PathologicalPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            num_classes_per_partition=self.classes_per_client,
            class_assignment_mode=self.class_assignment,  # type: ignore[arg-type]
            shuffle=False,
            seed=part_seed,
        )
        hint = "use fewer clients or a smaller classes_per_client"
        parts = _run(p, _table(data, shuffle_seed), num_clients, "pathological", hint)
        used = np.zeros(data.num_classes, dtype=bool)
        for a in parts:
            used[data.labels[a]] = True
        unused = sorted(set(np.unique(data.labels).tolist()) - set(np.flatnonzero(used).tolist()))
        if unused:
            log.info(
                "pathological: no client drew classes %s; their samples are left out "
                "(class_assignment='first-deterministic' uses every class when "
                "num_clients >= classes)",
                unused,
            )
        return parts


@PARTITIONS.register("natural_id")
@dataclass(frozen=True)
class NaturalId(Scheme):
    """One client per domain; with ``alpha``, Dirichlet label skew inside each domain.

    Clients are ordered by domain id: with ``c`` clients per domain, client
    ``i`` belongs to the ``i // c``-th smallest domain id. ``clients_per_domain``
    left unset means ``num_clients / number of domains``.
    """

    uses_domains: ClassVar[bool] = True
    alpha: float | None = None
    clients_per_domain: int | None = None
    min_partition_size: int = 2

    def __post_init__(self) -> None:
        if self.alpha is not None:
            object.__setattr__(self, "alpha", _check_real("alpha", self.alpha))
        if self.clients_per_domain is not None:
            cpd = _check_int("clients_per_domain", self.clients_per_domain, 1)
            object.__setattr__(self, "clients_per_domain", cpd)
            if self.alpha is None and cpd != 1:
                raise DataError(
                    "natural_id without alpha makes one client per domain; set alpha "
                    "to split each domain into clients_per_domain clients"
                )
        object.__setattr__(
            self, "min_partition_size", _check_int("min_partition_size", self.min_partition_size, 0)
        )

    def _per_domain(self, data: PartitionData, num_clients: int) -> tuple[np.ndarray, int]:
        if data.domains is None:
            raise DataError(
                "natural_id needs a domain per sample; pass domains= (e.g. ImageSet.domains) "
                "or pick another scheme"
            )
        doms = np.unique(data.domains)
        cpd = self.clients_per_domain or max(1, num_clients // doms.size)
        if self.alpha is None:
            cpd = 1
        if doms.size * cpd != num_clients:
            raise DataError(
                f"natural_id: {doms.size} domains x {cpd} client(s) per domain = "
                f"{doms.size * cpd} clients, but num_clients={num_clients}; set "
                f"num_clients={doms.size * cpd}"
                + ("" if self.alpha is not None else " or set alpha to split each domain")
            )
        return doms, cpd

    def check(self, data: PartitionData, num_clients: int) -> None:
        _, cpd = self._per_domain(data, num_clients)
        if self.alpha is not None:
            for d, n in zip(*np.unique(data.domains, return_counts=True), strict=True):
                _check_min_size(int(n), cpd, self.min_partition_size, f"domain {int(d)}")

    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]:
        # heavy: flwr_datasets (imports datasets, ~2 s)
        from flwr_datasets.partitioner import NaturalIdPartitioner

        doms, cpd = self._per_domain(data, num_clients)
        shuffle_seed, *dom_seeds = _seeds(seed, 1 + doms.size)
        table = _table(data, shuffle_seed)
        p = NaturalIdPartitioner(partition_by="domain")
        p.dataset = table
        with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
            domain_parts = [p.load_partition(i) for i in range(p.num_partitions)]
        if self.alpha is None:
            return [_indices(part) for part in domain_parts]
        out: list[np.ndarray] = []
        for part, s in zip(domain_parts, dom_seeds, strict=True):
            # a fresh table per domain (rows already shuffled) rather than the selected
            # view: Flower reads its label column row by row through the view's mapping
            idx = _indices(part)
            sub = _table(PartitionData(data.labels[idx], None, data.num_classes), None)
            parts = _dirichlet(sub, cpd, self.alpha, self.min_partition_size, False, s)
            out.extend(idx[a] for a in parts)
        return out


@PARTITIONS.register("quantity_skew")
@dataclass(frozen=True)
class QuantitySkew(Scheme):
    """IID labels, client sizes ``min_partition_size + Dir(beta)`` share of the rest.

    Sizes are drawn once (no resampling loop): each client first gets
    ``min_partition_size`` samples, the remaining ``N - n*min`` are shared out by
    Dirichlet proportions with largest-remainder rounding, so sizes sum to N.
    """

    beta: float = 0.5
    min_partition_size: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "beta", _check_real("beta", self.beta))
        object.__setattr__(
            self, "min_partition_size", _check_int("min_partition_size", self.min_partition_size, 1)
        )

    def check(self, data: PartitionData, num_clients: int) -> None:
        _check_min_size(data.num_samples, num_clients, self.min_partition_size)

    def sizes(self, num_samples: int, num_clients: int, seed: int) -> list[int]:
        rest = num_samples - num_clients * self.min_partition_size
        share = np.random.default_rng(seed).dirichlet(np.full(num_clients, self.beta)) * rest
        base = np.floor(share).astype(np.int64)
        order = np.argsort(-(share - base), kind="stable")
        base[order[: rest - int(base.sum())]] += 1
        return [int(s) + self.min_partition_size for s in base]

    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]:
        # heavy: flwr_datasets (imports datasets, ~2 s)
        from flwr_datasets.partitioner import SizePartitioner

        shuffle_seed, size_seed = _seeds(seed, 2)
        sizes = self.sizes(data.num_samples, num_clients, size_seed)
        table = _table(data, shuffle_seed)
        return _run(SizePartitioner(sizes), table, num_clients, "quantity_skew", "")


# ---- entry point --------------------------------------------------------------------------
def _build_scheme(scheme: str, params: Mapping[str, Any]) -> tuple[str, Scheme]:
    try:
        cls = PARTITIONS.get(scheme)
    except ConfigError as e:
        raise DataError(str(e)) from None
    valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise DataError(
            f"unknown parameter(s) {', '.join(unknown)} for partition scheme {scheme!r}; "
            f"valid: {', '.join(valid) or '(none)'}"
        )
    return scheme.lower(), cls(**params)


def make_federation(
    labels: np.ndarray | torch.Tensor,
    scheme: str,
    num_clients: int,
    seed: int,
    *,
    domains: np.ndarray | torch.Tensor | None = None,
    num_classes: int | None = None,
    cache_dir: str | Path | None = None,
    **params: Any,
) -> Federation:
    """Split ``labels`` (a train set's) among ``num_clients`` clients by ``scheme``.

    ``params`` are the scheme's (e.g. ``alpha=0.1`` for ``dirichlet``); the
    federation records them with the defaults filled in. The same arguments give
    the same federation. ``domains`` are read only by schemes that use them
    (``natural_id``). With ``cache_dir`` the result is stored there as JSON
    under its :meth:`Federation.key` and read back on the next identical call.
    """
    lab = as_label_array(labels)
    name, cfg = _build_scheme(scheme, params)
    n_clients = _check_int("num_clients", num_clients, 1)
    seed = _check_int("seed", seed, 0)
    k = int(lab.max()) + 1 if lab.size else 1
    if num_classes is not None:
        num_classes = _check_int("num_classes", num_classes, 1)
        if num_classes < k:
            raise DataError(f"num_classes={num_classes} but the labels go up to {k - 1}")
        k = num_classes
    dom = None
    if domains is not None and cfg.uses_domains:
        dom = as_label_array(domains, "domains")
        if dom.shape != lab.shape:
            raise DataError(
                f"{dom.shape[0]} domains for {lab.shape[0]} labels; pass one per sample"
            )
    if n_clients > lab.shape[0]:
        raise DataError(
            f"num_clients={n_clients} is more than the {lab.shape[0]} samples; use fewer clients"
        )
    data = PartitionData(lab, dom, k)
    cfg.check(data, n_clients)

    resolved = asdict(cfg)  # type: ignore[call-overload]
    fp = fingerprint_labels(lab, dom)
    key = federation_key(name, resolved, seed, n_clients, k, lab.shape[0], fp)
    path = Path(cache_dir) / f"federation-{name}-{key}.json" if cache_dir is not None else None
    if path is not None and path.exists():
        try:
            fed = Federation.load_json(path)
            if fed.key() == key:
                log.info("federation %s loaded from cache %s", name, path)
                return fed
            log.warning("cached federation %s has another key; recomputing", path)
        except DataError as e:
            log.warning("ignoring unreadable cached federation (%s); recomputing", e)

    fed = _compute(cfg, data, name, resolved, n_clients, seed, fp)
    sizes = fed.sizes
    log.info(
        "federation %s%s: %d clients, %d..%d samples, %.1f classes per client",
        name,
        resolved,
        n_clients,
        sizes.min(),
        sizes.max(),
        fed.classes_per_client().mean(),
    )
    if path is not None:
        fed.save_json(path)
    return fed


def _compute(
    cfg: Scheme,
    data: PartitionData,
    name: str,
    resolved: dict[str, Any],
    num_clients: int,
    seed: int,
    fingerprint: str,
) -> Federation:
    """Run the scheme and check Flower's output (a separate function so tests can
    prove the cache skips it)."""
    parts = cfg.split(data, num_clients, seed)
    if len(parts) != num_clients:
        raise DataError(f"{name} made {len(parts)} clients, expected {num_clients}")
    try:
        return Federation.from_indices(
            data.labels,
            parts,
            scheme=name,
            params=resolved,
            seed=seed,
            num_classes=data.num_classes,
            data_fingerprint=fingerprint,
        )
    except DataError as e:
        raise DataError(f"{name} produced an invalid split ({e}); try other parameters") from None
