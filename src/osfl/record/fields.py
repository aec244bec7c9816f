"""A run record's fields: what each must be, checked as a record is read
(:class:`RecordError` naming the field), and a record's JSON values made
read-only and back (:func:`frozen`, :func:`plain`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from osfl.errors import DataError


class RecordError(DataError):
    """A record that is not a run record; ``field`` names the key at fault
    (``None``: the record as a whole)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def number(v: Any) -> bool:
    """A JSON number or null (a bool is no number)."""
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _numbers(v: Any) -> bool:
    return isinstance(v, Mapping) and all(number(x) for x in v.values())


def _byte_count(v: Any) -> bool:
    """A byte count: a finite number, never negative (a damaged file's ``-5``
    would be summed into a table's bytes)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 and (isinstance(v, int) or math.isfinite(v))


def _strings(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)


def object_or_none(v: Any) -> bool:
    return v is None or isinstance(v, Mapping)


def _points(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(x, Mapping) for x in v)


def integer(v: Any) -> bool:
    """A JSON integer (a bool is none)."""
    return isinstance(v, int) and not isinstance(v, bool)


def integer_or_none(v: Any) -> bool:
    """A JSON integer or null."""
    return v is None or integer(v)


#: The record fields osfl's readers (tables, plots, audits) use, with what each
#: must be when present: a damaged file is one RecordError, never a traceback.
RECORD_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "method": (lambda v: isinstance(v, str), "a string"),
    "seed": (integer, "an integer"),
    "point": (lambda v: isinstance(v, str), "a string"),
    "sweep": (object_or_none, "an object"),
    "num_samples": (integer_or_none, "an integer"),
    "regime": (lambda v: isinstance(v, str), "a string"),
    "audit": (lambda v: isinstance(v, Mapping), "an object"),
    "method_config": (object_or_none, "an object"),
    "train": (object_or_none, "an object"),
    "partition": (object_or_none, "an object"),
    "global_test_accuracy": (number, "a number"),
    "mean_client_accuracy": (number, "a number"),
    "local_test_accuracy": (number, "a number"),
    "mean_client_local_test_accuracy": (number, "a number"),
    "rounds": (integer, "an integer"),
    "evaluated_at": (lambda v: isinstance(v, str), "a string"),
    "task": (object_or_none, "an object"),
    "provenance": (object_or_none, "an object"),
    "server_rules": (object_or_none, "an object"),
    "convergence": (object_or_none, "an object"),
    "best_on_validation": (object_or_none, "an object"),
    "bytes_up": (_byte_count, "a non-negative number"),
    "bytes_down": (_byte_count, "a non-negative number"),
    "time_s": (_numbers, "an object of numbers"),
    "warnings": (_strings, "a list of strings"),
    "curve": (_points, "a list"),
}
REQUIRED_FIELDS = ("method", "seed")


def record_problem(r: Any) -> str | None:
    """Why ``r`` is not a record osfl's readers can use (``None``: it is)."""
    try:
        check_record(r)
    except RecordError as e:
        return str(e)
    return None


def check_record(r: Any) -> None:
    """Raise :class:`RecordError` (its ``field`` set) unless ``r`` is a record
    whose fields have the types :data:`RECORD_FIELDS` names."""
    if not isinstance(r, Mapping):
        raise RecordError("is not an object")
    for key in REQUIRED_FIELDS:
        if key not in r:
            raise RecordError(f"lacks {key!r}", key)
    for key, (ok, what) in RECORD_FIELDS.items():
        if key in r and not ok(r[key]):
            raise RecordError(f"field {key!r} must be {what}", key)


def frozen(v: Any) -> Any:
    """A JSON value made read-only (objects as MappingProxyType, lists as tuples)."""
    if isinstance(v, Mapping):
        return MappingProxyType({k: frozen(x) for k, x in v.items()})
    if isinstance(v, list | tuple):
        return tuple(frozen(x) for x in v)
    return v


def plain(v: Any) -> Any:
    """The JSON value back (plain dicts and lists): what a reader that writes
    a record's value out as JSON (a suite row, a sorted-JSON comparison)
    calls on a typed record's read-only value."""
    if isinstance(v, Mapping):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [plain(x) for x in v]
    return v
