"""The record's file versions: which ``schema_version`` this code writes
and reads, and :func:`migrate`, which reads an older record into the
current names (the package docstring lists what each version changed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from osfl.record.fields import RecordError, check_record, integer
from osfl.record.types import RunRecord

#: The ``schema_version`` this code writes (see the package docstring).
SCHEMA_VERSION = 3

#: Versions :func:`migrate` reads (a file without ``schema_version`` is 1).
READABLE_VERSIONS = (1, 2, 3)


#: Version 2's names of the clients' own models' numbers (a record with
#: ``mean_client_accuracy``) -> version 3's.
V2_CLIENT_KEYS = {
    "per_class_accuracy": "mean_client_per_class_accuracy",
    "validation_accuracy": "mean_client_validation_accuracy",
    "local_test_accuracies": "client_local_test_accuracies",
    "local_test_accuracy": "mean_client_local_test_accuracy",
    "nonfinite_outputs": "client_nonfinite_outputs",
}
#: Version 2's names of the server predictor's numbers beside the clients' -> version 3's.
V2_SERVER_KEYS = {
    "server_per_class_accuracy": "per_class_accuracy",
    "server_validation_accuracy": "validation_accuracy",
    "server_local_test_accuracy": "local_test_accuracy",
}


def migrate(r: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A record of file version ``version`` as the current version writes it.

    1 -> 2: an own-models record (``mean_client_accuracy`` present and equal to
    ``global_test_accuracy``) had the clients' mean as its accuracy; it becomes
    the server predictor's ``server_accuracy`` (``None`` without one: ``local``).

    2 -> 3: a record with clients' own models (``mean_client_accuracy``) has
    its clients' numbers renamed (:data:`V2_CLIENT_KEYS`), its server
    predictor's ``server_*`` numbers under the plain names
    (:data:`V2_SERVER_KEYS`; ``server_accuracy``, equal to
    ``global_test_accuracy``, dropped); every record's curve, convergence and
    best round on validation name their accuracies (:func:`_migrate_curve`).
    """
    out = dict(r)
    if version < 2 and "mean_client_accuracy" in out:
        mean, acc = out["mean_client_accuracy"], out.get("global_test_accuracy")
        if acc is not None and acc == mean:
            out["global_test_accuracy"] = out.get("server_accuracy")
    if version < 3:
        out = _migrate_to_3(out)
    return out


def _migrate_to_3(r: Mapping[str, Any]) -> dict[str, Any]:
    """A version-2 record as version 3 writes it (:func:`migrate`)."""
    clients = "mean_client_accuracy" in r
    out: dict[str, Any] = {}
    for k, v in r.items():
        if clients and k == "server_accuracy":
            continue
        if clients and k in V2_CLIENT_KEYS:
            out[V2_CLIENT_KEYS[k]] = v
        elif clients and k in V2_SERVER_KEYS:
            out[V2_SERVER_KEYS[k]] = v
        elif k == "curve" and isinstance(v, list):
            out[k] = [_migrate_point(p, clients) for p in v]
        elif k in ("convergence", "best_on_validation") and isinstance(v, Mapping):
            out[k] = _migrate_block(k, v, clients)
        else:
            out[k] = v
    return out


def _migrate_point(p: Any, clients: bool) -> Any:
    """A version-2 curve point: ``accuracy`` was the clients' mean where the
    record had clients' models (the server's beside it: ``server_accuracy``)."""
    if not isinstance(p, Mapping) or "accuracy" not in p:
        return p
    out: dict[str, Any] = {"round": p.get("round")}
    if clients:
        out["global_test_accuracy"] = p.get("server_accuracy")
        out["mean_client_accuracy"] = p["accuracy"]
    else:
        out["global_test_accuracy"] = p["accuracy"]
    for k, v in p.items():
        if k in ("round", "accuracy", "server_accuracy"):
            continue
        out["mean_client_validation_accuracy" if clients and k == "validation_accuracy" else k] = v
    return out


def _migrate_block(key: str, block: Mapping[str, Any], clients: bool) -> dict[str, Any]:
    """Version 2's ``convergence`` (measured on the curve's ``accuracy``) and
    ``best_on_validation`` (``validation_accuracy``, ``accuracy``), named."""
    acc = "mean_client_accuracy" if clients else "global_test_accuracy"
    if key == "convergence":  # the key where version 3 writes it, after link_mbps
        head = {k: v for k, v in block.items() if k == "link_mbps"}
        return {**head, "accuracy_key": acc, **block}
    val = "mean_client_validation_accuracy" if clients else "validation_accuracy"
    names = {"accuracy": acc, "validation_accuracy": val}
    return {names.get(k, k): v for k, v in block.items()}


def file_version(doc: Mapping[str, Any]) -> int:
    """The ``schema_version`` of a ``metrics.json`` document (absent: 1);
    :class:`RecordError` on one this code cannot read."""
    version = doc.get("schema_version", 1)
    if not integer(version):
        raise RecordError("field 'schema_version' must be an integer", "schema_version")
    if version not in READABLE_VERSIONS:
        newer = " (written by a newer osfl: upgrade osfl to read it)" if version > 0 else ""
        raise RecordError(
            f"field 'schema_version' is {version}, this osfl reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}{newer}",
            "schema_version",
        )
    return int(version)


def read_records(records: Sequence[Any], version: int) -> list[RunRecord]:
    """Typed records of a document's ``records`` list; :class:`RecordError`
    ``record I ...`` for the first that is not one."""
    out = []
    for i, r in enumerate(records):
        try:
            check_record(r)  # before migrate, which needs an object
            out.append(RunRecord.from_dict(migrate(r, version)))
        except RecordError as e:
            raise RecordError(f"record {i} {e}", e.field) from e
    return out


def as_json(r: RunRecord | Mapping[str, Any]) -> dict[str, Any]:
    """A record, typed or not, as the JSON object ``metrics.json`` holds."""
    return r.to_dict() if isinstance(r, RunRecord) else dict(r)
