"""One scoreboard from several run directories (``osfl table``).

A comparison is often run in parts: the shared baselines in one run, a new
peer in another, a variant of it in a third, all on the same clients (the
client cache makes that one client training). This module merges their
records into one table per regime (:func:`osfl.report.by_regime`: numbers of
different regimes are never ranked together) and refuses to merge runs whose
clients differ, because then their numbers are not a comparison.

Two runs of the same method with different options (e.g. FuseFL's
``classifier``) or training recipes (``method_train``) become separate rows,
labelled by what differs. The seeds of one row must be comparable: the same
regime, task (data, image size, test set, model, transforms), training
recipe and partition scheme, or the table refuses with one line naming the
difference; a record without a split key (written before splits were keyed)
is refused unless ``allow_unkeyed`` says to take it on trust.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.record import RunRecord, plain
from osfl.report import read_metrics

__all__ = ["merge_runs", "variant_labels"]


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1, "c": "x"}}`` -> ``{"a.b": "1", "a.c": "x"}`` (non-strings as JSON)."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return out


def variant_labels(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """For option trees of one method, the ``key=value`` list of the options in
    which each differs from the others ("" when they are all equal)."""
    flats = [_flat(c) for c in configs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({f.get(k) for f in flats}) > 1]
    return [", ".join(f"{k}={f.get(k, '—')}" for k in differ) for f in flats]


@dataclass(frozen=True)
class Entry:
    """One record of the merge and the run directory it came from."""

    record: RunRecord
    run: str


def _variant_tree(record: RunRecord) -> dict[str, Any]:
    """What makes two records of one method different runs of it: its options
    and, where recorded, its local-training recipe (``train``)."""
    tree = dict(record.method_config or {})
    if "train" in record.keys_written:
        tree["train"] = record.train
    return plain(tree)


def _check_same_clients(entries: Sequence[Entry]) -> None:
    """Refuse runs whose partition keys differ at one grid point and seed."""
    clients: dict[tuple[str, int], tuple[str, str]] = {}
    for e in entries:
        key = e.record.partition_key
        if key is None:
            continue
        where = (e.record.point, e.record.seed)
        first, run = clients.setdefault(where, (key, e.run))
        if first != key:
            point = f"grid point {where[0]!r}, " if where[0] else ""
            raise DataError(
                f"{run} and {e.run} split the data differently ({point}seed {where[1]}): "
                "their numbers are not on the same clients, so they are not one scoreboard"
            )


#: What the seeds averaged into one row must share, by the name the refusal uses.
ROW_INVARIANTS: dict[str, Callable[[RunRecord], Any]] = {
    "regime": lambda r: r.regime if "regime" in r.keys_written else None,
    "task (data, image size, model, transforms)": lambda r: r.task,
    "test set": lambda r: r.test_set,
    "training recipe": lambda r: r.train,
    "partition scheme": lambda r: {
        k: (r.partition or {}).get(k) for k in ("scheme", "params", "num_clients")
    },
    "server rules": lambda r: r.server_rules,
}


def _json(value: Any) -> str:
    """A typed record's value (read-only mappings and tuples) as sorted JSON."""
    return json.dumps(plain(value), sort_keys=True, default=str)


def _check_comparable_rows(entries: Sequence[Entry]) -> None:
    """Refuse a row whose seeds differ in anything but the seed."""
    rows: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        rows.setdefault((e.record.point, e.record.method), []).append(e)
    for (point, method), group in rows.items():
        for name, of in ROW_INVARIANTS.items():
            seen = {_json(of(e.record)): e for e in group}
            if len(seen) > 1:
                a, b = list(seen.values())[:2]
                at = f" at {point!r}" if point else ""
                raise DataError(
                    f"{method}{at}: seed {a.record.seed} ({a.run}) and seed {b.record.seed} "
                    f"({b.run}) differ in their {name}: not one row of a comparison"
                )


def _check_keyed(entries: Sequence[Entry]) -> None:
    """Refuse records whose split cannot be checked (no partition key)."""
    for e in entries:
        r = e.record
        if r.partition_key is None and (r.partition or {}).get("scheme") != "sites":
            raise DataError(
                f"{e.run}: {r.method} seed {r.seed} has no split key (a record "
                "written before splits were keyed): its clients cannot be checked against "
                "the others; pass --allow-unkeyed to take it on trust"
            )


def _label_variants(entries: Sequence[Entry]) -> list[Entry]:
    """The entries, each record relabelled ``method (key=value, ...)`` where
    one method ran in more than one variant (:func:`_variant_tree`): new
    records (:func:`dataclasses.replace`), none edited in place."""
    trees = [json.dumps(_variant_tree(e.record), sort_keys=True) for e in entries]
    labels: dict[tuple[str, str], str] = {}
    for method in dict.fromkeys(e.record.method for e in entries):
        distinct = {
            t: _variant_tree(e.record)
            for t, e in zip(trees, entries, strict=True)
            if e.record.method == method
        }
        if len(distinct) > 1:
            for t, label in zip(distinct, variant_labels(list(distinct.values())), strict=True):
                labels[(method, t)] = f"{method} ({label})"
    return [
        dataclasses.replace(e, record=dataclasses.replace(e.record, method=labels[key]))
        if (key := (e.record.method, t)) in labels
        else e
        for t, e in zip(trees, entries, strict=True)
    ]


def _check_one_owner(entries: Sequence[Entry]) -> None:
    """One number per (grid point, row, seed), or the mean would count it twice."""
    owner: dict[tuple[str, str, int], str] = {}
    for e in entries:
        cell = (e.record.point, e.record.method, e.record.seed)
        first = owner.setdefault(cell, e.run)
        if first != e.run:
            at = f" at {cell[0]!r}" if cell[0] else ""
            raise DataError(
                f"{first} and {e.run} both hold {cell[1]} seed {cell[2]}{at}: pass only one of them"
            )


def _read_runs(run_dirs: Sequence[str | Path]) -> list[Entry]:
    """Every record of every run directory; one line for a directory that is not one."""
    entries: list[Entry] = []
    for d in run_dirs:
        path = Path(d) / "metrics.json"
        if not path.is_file():
            raise DataError(f"{d}: not an osfl run directory (no metrics.json)")
        entries += [Entry(r, str(d)) for r in read_metrics(path)["records"]]
    if not entries:
        where = ", ".join(map(str, run_dirs))
        raise DataError(
            f"{where}: no finished record in metrics.json, nothing to tabulate (a run that "
            "stopped before its first record: osfl run --resume DIR finishes it)"
        )
    return entries


def merge_runs(run_dirs: Sequence[str | Path], *, allow_unkeyed: bool = False) -> list[RunRecord]:
    """The records of every run, with ``method`` relabelled where one method ran
    in several variants across the runs, a grid point's rows together.

    Raises :class:`DataError` (one line) for a directory without a readable
    ``metrics.json``, when no run holds a record, when two runs split the
    data differently at the same grid point and seed, when two runs hold the
    same row's same seed, when a row's seeds differ in anything but the seed
    (:data:`ROW_INVARIANTS`), or for a record without a split key (unless
    ``allow_unkeyed``). The records read are never changed: a relabelled
    one is a new record."""
    entries = _read_runs(run_dirs)
    if not allow_unkeyed:
        _check_keyed(entries)
    _check_same_clients(entries)
    entries = _label_variants(entries)
    _check_one_owner(entries)
    _check_comparable_rows(entries)
    points = {p: i for i, p in enumerate(dict.fromkeys(e.record.point for e in entries))}
    return [e.record for e in sorted(entries, key=lambda e: points[e.record.point])]  # stable
