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

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.record import RunRecord
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


def _variant_tree(record: Mapping[str, Any]) -> dict[str, Any]:
    """What makes two records of one method different runs of it: its options
    and, where recorded, its local-training recipe (``train``)."""
    tree = dict(record.get("method_config") or {})
    if "train" in record:
        tree["train"] = record["train"]
    return tree


def _check_same_clients(records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse runs whose partition keys differ at one grid point and seed."""
    clients: dict[tuple[str, int], tuple[str, str]] = {}
    for r in records:
        part = r.get("partition")
        if not (isinstance(part, Mapping) and "key" in part):
            continue
        where = (str(r.get("point", "")), int(r["seed"]))
        key, run = clients.setdefault(where, (str(part["key"]), r["_run"]))
        if key != str(part["key"]):
            point = f"grid point {where[0]!r}, " if where[0] else ""
            raise DataError(
                f"{run} and {r['_run']} split the data differently ({point}seed {where[1]}): "
                "their numbers are not on the same clients, so they are not one scoreboard"
            )


#: What the seeds averaged into one row must share, by the name the refusal uses.
ROW_INVARIANTS: dict[str, Any] = {
    "regime": lambda r: r.get("regime"),
    "task (data, image size, model, transforms)": lambda r: r.get("task"),
    "test set": lambda r: ((r.get("provenance") or {}).get("data") or {}).get("test"),
    "training recipe": lambda r: r.get("train"),
    "partition scheme": lambda r: {
        k: (r.get("partition") or {}).get(k) for k in ("scheme", "params", "num_clients")
    },
    "server rules": lambda r: r.get("server_rules"),
}


def _check_comparable_rows(records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a row whose seeds differ in anything but the seed."""
    rows: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        rows.setdefault((str(r.get("point", "")), str(r["method"])), []).append(r)
    for (point, method), recs in rows.items():
        for name, of in ROW_INVARIANTS.items():
            seen = {json.dumps(of(r), sort_keys=True, default=str): r for r in recs}
            if len(seen) > 1:
                a, b = list(seen.values())[:2]
                at = f" at {point!r}" if point else ""
                raise DataError(
                    f"{method}{at}: seed {a['seed']} ({a['_run']}) and seed {b['seed']} "
                    f"({b['_run']}) differ in their {name}: not one row of a comparison"
                )


def _check_keyed(records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse records whose split cannot be checked (no partition key)."""
    for r in records:
        part = r.get("partition") or {}
        if not (isinstance(part, Mapping) and ("key" in part or part.get("scheme") == "sites")):
            raise DataError(
                f"{r['_run']}: {r['method']} seed {r['seed']} has no split key (a record "
                "written before splits were keyed): its clients cannot be checked against "
                "the others; pass --allow-unkeyed to take it on trust"
            )


def _label_variants(records: Sequence[dict[str, Any]]) -> None:
    """Rename ``method`` to ``method (key=value, ...)`` where one method ran in
    more than one variant (:func:`_variant_tree`)."""
    by_method: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(
            (json.dumps(_variant_tree(r), sort_keys=True), r)
        )
    for method, recs in by_method.items():
        distinct = {key: _variant_tree(r) for key, r in recs}
        if len(distinct) < 2:
            continue
        labels = dict(zip(distinct, variant_labels(list(distinct.values())), strict=True))
        for key, r in recs:
            r["method"] = f"{method} ({labels[key]})"


def _check_one_owner(records: Sequence[Mapping[str, Any]]) -> None:
    """One number per (grid point, row, seed), or the mean would count it twice."""
    owner: dict[tuple[str, str, int], str] = {}
    for r in records:
        cell = (str(r.get("point", "")), r["method"], int(r["seed"]))
        first = owner.setdefault(cell, r["_run"])
        if first != r["_run"]:
            at = f" at {cell[0]!r}" if cell[0] else ""
            raise DataError(
                f"{first} and {r['_run']} both hold {cell[1]} seed {cell[2]}{at}: "
                "pass only one of them"
            )


def merge_runs(run_dirs: Sequence[str | Path], *, allow_unkeyed: bool = False) -> list[RunRecord]:
    """The records of every run, with ``method`` relabelled where one method ran
    in several variants across the runs, a grid point's rows together.

    Raises :class:`DataError` (one line) for a directory without a readable
    ``metrics.json``, when no run holds a record, when two runs split the
    data differently at the same grid point and seed, when two runs hold the
    same row's same seed, when a row's seeds differ in anything but the seed
    (:data:`ROW_INVARIANTS`), or for a record without a split key (unless
    ``allow_unkeyed``)."""
    records: list[dict[str, Any]] = []
    for d in run_dirs:
        path = Path(d) / "metrics.json"
        if not path.is_file():
            raise DataError(f"{d}: not an osfl run directory (no metrics.json)")
        records += [{**r, "_run": str(d)} for r in read_metrics(path)["records"]]
    if not records:
        where = ", ".join(map(str, run_dirs))
        raise DataError(
            f"{where}: no finished record in metrics.json, nothing to tabulate (a run that "
            "stopped before its first record: osfl run --resume DIR finishes it)"
        )
    if not allow_unkeyed:
        _check_keyed(records)
    _check_same_clients(records)
    _label_variants(records)
    _check_one_owner(records)
    _check_comparable_rows(records)
    points = {p: i for i, p in enumerate(dict.fromkeys(str(r.get("point", "")) for r in records))}
    records.sort(key=lambda r: points[str(r.get("point", ""))])  # stable
    return [RunRecord.from_dict({k: v for k, v in r.items() if k != "_run"}) for r in records]
