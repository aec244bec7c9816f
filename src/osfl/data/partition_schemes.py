"""The partition schemes, each a wrapper around a ``flwr_datasets.partitioner``
(Flower Datasets, Beutel et al., "Flower: A Friendly Federated Learning
Research Framework", arXiv:2007.14390) rather than a rewrite of it.

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

Every bad parameter is refused in ``__post_init__`` / ``check`` with a
:class:`~osfl.errors.DataError` that says what to change.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from osfl.data.flwr_partitioners import (
    _check_int,
    _check_min_size,
    _check_real,
    _dirichlet,
    _indices,
    _run,
    _seeds,
    _table,
)
from osfl.data.partition_base import PARTITIONS, PartitionData, Scheme
from osfl.errors import DataError

log = logging.getLogger(__name__)


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
