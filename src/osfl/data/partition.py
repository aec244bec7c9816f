"""Federated partitions: split a train set's labels into per-client index sets.

The schemes wrap ``flwr_datasets.partitioner`` (Flower Datasets, Beutel et al.,
"Flower: A Friendly Federated Learning Research Framework", arXiv:2007.14390)
rather than rewrite it: the labels (and domains) become a tiny
``datasets.Dataset`` with an ``index`` column, the partitioner's
``load_partition(i)`` is called for every client, and the ``index`` column maps
its rows back to positions in the train set.

The schemes (registry :data:`PARTITIONS`: ``iid``, ``dirichlet``, ``pathological``,
``natural_id``, ``quantity_skew``) and their papers are in
:mod:`osfl.data.partition_schemes`; what a scheme is, in :mod:`osfl.data.partition_base`;
the helpers around Flower's partitioners, in :mod:`osfl.data.flwr_partitioners`. This
module is the entry point, :func:`make_federation` (checks, the cache, the run).

Every bad parameter is refused up front with an :class:`~osfl.errors.DataError`
that says what to change; Flower's own ``ValueError``\\ s (e.g. a Dirichlet split
that cannot reach ``min_partition_size``) are re-raised the same way, so no
split ever loops or ends in a bare traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osfl.data.federation import Federation, as_label_array, federation_key, fingerprint_labels
from osfl.data.flwr_partitioners import _check_int
from osfl.data.partition_base import PARTITIONS, PartitionData, Scheme
from osfl.data.partition_schemes import Dirichlet, Iid, NaturalId, Pathological, QuantitySkew
from osfl.errors import ConfigError, DataError

log = logging.getLogger(__name__)

__all__ = [
    "PARTITIONS",
    "Dirichlet",
    "Federation",
    "Iid",
    "NaturalId",
    "PartitionData",
    "Pathological",
    "QuantitySkew",
    "Scheme",
    "make_federation",
]


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
            if fed.recipe_key() == key:
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
