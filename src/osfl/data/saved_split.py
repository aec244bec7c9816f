"""A saved split reused: ``partition.from_file=PARTITION.json`` (issue "What a
researcher expects, round three", item 3; issue 51).

``osfl partition ... --out p.json`` writes a federation; a run that names it
trains on exactly those clients instead of drawing a split, so two runs (two
machines, two versions of osfl, a baseline from another library that reads
the same file) compare on the same clients. The file is validated field by
field (:meth:`Federation.load_json`: a peer's or a user's file is never
trusted; its key covers every index, so an edit is refused), it must have
been made on this run's train set (its labels' content hash) with the run's
number of clients, and each client's class counts must be those of its
indices' labels (the heat map shows what the clients hold, never what a file
claims). Every seed of a sweep then shares this one split.

The file fixes the scheme, its parameters and the seed, so a config that
asks for others beside it is refused rather than ignored: each of
``partition.scheme``, ``alpha``, ``classes_per_client``,
``min_partition_size``, ``seed`` and ``options`` must be the file's, unset,
or left at a default (the packaged default's or the dataclass's: a user who
never touched them is not refused).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from osfl.data.federation import Federation, as_label_array, fingerprint_labels
from osfl.errors import ConfigError, DataError

#: The partition keys a saved split fixes (``num_clients`` must equal its count).
FIXED = ("scheme", "alpha", "classes_per_client", "min_partition_size", "seed")


def load_saved_split(
    path: str | Path,
    labels: Any,
    domains: Any,
    num_clients: int,
    *,
    asked: Mapping[str, Any] | None = None,
    defaults: Sequence[Mapping[str, Any]] = (),
) -> Federation:
    """The federation saved in ``path``, checked against this run's train
    ``labels`` (and ``domains``, where its scheme read them), ``num_clients``
    and, when given, the partition options ``asked`` (the config's
    ``partition`` as a dict; ``defaults``: the values a user who set nothing
    has)."""
    fed = Federation.load_json(path)
    lab = as_label_array(labels)
    made_on = {fingerprint_labels(lab)}
    if domains is not None:
        made_on.add(fingerprint_labels(lab, as_label_array(domains, "domains")))
    if fed.data_fingerprint not in made_on or fed.num_samples != len(lab):
        raise DataError(
            f"partition.from_file={path}: made on another train set ({fed.num_samples} samples, "
            f"labels {fed.data_fingerprint[:12]}; this run's: {len(lab)} samples, "
            f"labels {fingerprint_labels(lab)[:12]}): same data, data.max_per_class and "
            "data.classes as when it was written"
        )
    if fed.num_clients != num_clients:
        raise ConfigError(
            f"partition.from_file={path} holds {fed.num_clients} clients; set "
            f"partition.num_clients={fed.num_clients}"
        )
    _check_counts(fed, lab, path)
    if asked is not None:
        _check_asked(fed, asked, defaults, path)
    return fed


def _check_counts(fed: Federation, labels: np.ndarray, path: str | Path) -> None:
    """Each client's class counts are its indices' labels counted, or the
    file is refused (the counts drive the heat map and the records)."""
    width = max(fed.num_classes, int(labels.max()) + 1 if labels.size else 0)
    for c, idx in enumerate(fed.client_indices):
        held = np.bincount(labels[idx], minlength=width)
        if held.shape[0] != fed.num_classes or not np.array_equal(held, fed.class_counts[c]):
            raise DataError(
                f"partition.from_file={path}: client {c}'s class_counts are not the classes "
                "of its indices on this train set (an edited file); re-create it with "
                "osfl partition"
            )


def _allowed(value: Any, saved: Any, key: str, defaults: Sequence[Mapping[str, Any]]) -> bool:
    if key == "scheme" and isinstance(value, str):  # scheme names are case-blind
        value, saved = value.lower(), str(saved).lower()
        defaults = [{key: str(d.get(key)).lower()} for d in defaults]
    return value is None or value == saved or any(value == d.get(key) for d in defaults)


def _check_asked(
    fed: Federation,
    asked: Mapping[str, Any],
    defaults: Sequence[Mapping[str, Any]],
    path: str | Path,
) -> None:
    """Refuse a partition option beside the file that the file overrides."""
    saved = {"scheme": fed.scheme, "seed": fed.seed, **dict(fed.params)}
    given = {k: asked.get(k) for k in FIXED} | {
        f"options.{k}": v for k, v in dict(asked.get("options") or {}).items()
    }
    for key, value in given.items():
        short = key.removeprefix("options.")
        if _allowed(value, saved.get(short), key, defaults):
            continue
        params = ", ".join(f"{k} {v}" for k, v in sorted(fed.params.items()))
        raise ConfigError(
            f"partition.{key}={value} beside partition.from_file={path}, a saved "
            f"{fed.scheme} split ({params + ', ' if params else ''}seed {fed.seed}): a saved "
            f"split fixes the scheme, its parameters and the seed; drop partition.{key} (or "
            "set it to the file's value)"
        )
