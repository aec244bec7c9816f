"""The run record: one (grid point, method, seed) result of ``metrics.json``.

One typed, versioned type for what ``osfl run`` writes (built by
:func:`osfl.run_record.run_record`), what ``osfl.report`` reads back
(:func:`osfl.report.read_metrics` validates every record here, so a damaged
file is one :class:`RecordError` naming the field, never a traceback deep in a
table), and what the tables, ``osfl table`` and the suite's rows rank. The
schema, field by field, is ``docs/run-directory.md``.

This module sits below everything that uses records: it imports only
:mod:`osfl.errors`.

:class:`RunRecord` is a read-only ``Mapping`` of the record's JSON keys as
well as a dataclass of its typed fields, because the record is also a file
format: users' scripts and osfl's benchmarks read ``record["bytes_up"]`` and
``record.get("curve")``, and :meth:`RunRecord.to_dict` writes exactly the keys
the record was built with (and in that order), so ``metrics.json`` keeps its
shape. Keys that only some methods or runs write (``server``, ``audit``,
``site_accuracies``, ...) are kept as written in ``extras``.

Versions (the document's ``schema_version``):

1. ``global_test_accuracy`` of a method whose clients keep their own models
   (``local``, EFTViT's ``OwnModels``) was the clients' mean.
2. ``global_test_accuracy`` is always the server predictor's accuracy (``None``
   where there is none, e.g. ``local``); the clients' mean is only
   ``mean_client_accuracy``. :func:`migrate` reads a version-1 record into it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from osfl.errors import DataError

#: The ``schema_version`` this code writes (see the module docstring).
SCHEMA_VERSION = 2

#: Versions :func:`migrate` reads (a file without ``schema_version`` is 1).
READABLE_VERSIONS = (1, 2)


class RecordError(DataError):
    """A record that is not a run record; ``field`` names the key at fault
    (``None``: the record as a whole)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _numbers(v: Any) -> bool:
    return isinstance(v, Mapping) and all(_number(x) for x in v.values())


def _byte_count(v: Any) -> bool:
    """A byte count: a finite number, never negative (a damaged file's ``-5``
    would be summed into a table's bytes)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 and (isinstance(v, int) or math.isfinite(v))


def _strings(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)


def _object_or_none(v: Any) -> bool:
    return v is None or isinstance(v, Mapping)


def _points(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(x, Mapping) for x in v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: The record fields osfl's readers (tables, plots, audits) use, with what each
#: must be when present: a damaged file is one RecordError, never a traceback.
RECORD_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "method": (lambda v: isinstance(v, str), "a string"),
    "seed": (_integer, "an integer"),
    "point": (lambda v: isinstance(v, str), "a string"),
    "regime": (lambda v: isinstance(v, str), "a string"),
    "audit": (lambda v: isinstance(v, Mapping), "an object"),
    "method_config": (_object_or_none, "an object"),
    "train": (_object_or_none, "an object"),
    "partition": (_object_or_none, "an object"),
    "global_test_accuracy": (_number, "a number"),
    "mean_client_accuracy": (_number, "a number"),
    "server_accuracy": (_number, "a number"),
    "local_test_accuracy": (_number, "a number"),
    "bytes_up": (_byte_count, "a non-negative number"),
    "bytes_down": (_byte_count, "a non-negative number"),
    "time_s": (_numbers, "an object of numbers"),
    "warnings": (_strings, "a list of strings"),
    "curve": (_points, "a list"),
}
REQUIRED_FIELDS = ("method", "seed")

_EMPTY: Mapping[str, Any] = MappingProxyType({})


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


def _frozen(v: Any) -> Any:
    """A JSON value made read-only (objects as MappingProxyType, lists as tuples)."""
    if isinstance(v, Mapping):
        return MappingProxyType({k: _frozen(x) for k, x in v.items()})
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


def _thawed(v: Any) -> Any:
    """The JSON value back (plain dicts and lists)."""
    if isinstance(v, Mapping):
        return {k: _thawed(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_thawed(x) for x in v]
    return v


def _default(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default value."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@dataclass(frozen=True, eq=False)
class RunRecord(Mapping[str, Any]):
    """One method × seed × grid point result (``docs/run-directory.md``).

    Typed fields are the ones osfl ranks, sums and plots; every other key is
    in ``extras``. ``keys_written`` is the record's key order, so that
    :meth:`to_dict` gives back exactly what was built or read (an absent
    optional field stays absent: ``None`` below means "not recorded" unless
    the key is in ``keys_written``)."""

    method: str
    seed: int
    point: str = ""
    #: what the numbers presuppose (osfl.fl.regimes); "" for records before regimes
    regime: str = ""
    #: the server predictor's test accuracy; ``None``: no server predictor
    #: (``local``), or no accuracy at all (``train_clients``)
    global_test_accuracy: float | None = None
    #: the mean test accuracy of the clients' own models (``local``, OwnModels)
    mean_client_accuracy: float | None = None
    #: the server predictor's accuracy as the runtime recorded it beside the
    #: clients' (OwnModels); equal to ``global_test_accuracy`` where present
    server_accuracy: float | None = None
    local_test_accuracy: float | None = None
    bytes_up: float | None = None
    bytes_down: float | None = None
    time_s: Mapping[str, float | None] = field(default_factory=lambda: _EMPTY)
    warnings: tuple[str, ...] = ()
    curve: tuple[Mapping[str, Any], ...] = ()
    #: the local-training recipe; ``None`` for a method that trains no recipe
    train: Mapping[str, Any] | None = None
    method_config: Mapping[str, Any] | None = None
    partition: Mapping[str, Any] | None = None
    audit: Mapping[str, Any] | None = None
    extras: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    keys_written: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        """A record built field by field (not :meth:`from_dict`) writes its
        required fields, the typed ones it sets and its extras, checked as read."""
        if self.keys_written:
            return
        set_here = [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in ("extras", "keys_written")
            and (f.name in REQUIRED_FIELDS or getattr(self, f.name) != _default(f))
        ]
        object.__setattr__(self, "keys_written", (*set_here, *self.extras))
        check_record(self.to_dict())

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunRecord:
        """The record of a current-version JSON object; :class:`RecordError`
        naming the field when one has the wrong type."""
        check_record(d)
        typed = {f.name for f in dataclasses.fields(cls)} - {"extras", "keys_written"}
        values = {k: _frozen(v) for k, v in d.items() if k in typed}
        extras = {k: _frozen(v) for k, v in d.items() if k not in typed}
        return cls(**values, extras=MappingProxyType(extras), keys_written=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``metrics.json`` holds, keys in their written order."""
        return {k: _thawed(self._value(k)) for k in self.keys_written}

    def replace(self, **changes: Any) -> RunRecord:
        """This record with keys set (added at the end when new), validated again."""
        return RunRecord.from_dict({**self.to_dict(), **changes})

    def without(self, *keys: str) -> RunRecord:
        """This record with ``keys`` left out."""
        return RunRecord.from_dict({k: v for k, v in self.to_dict().items() if k not in keys})

    # ------------------------------------------------------------------ reading
    @property
    def ranked_accuracy(self) -> float | None:
        """What a table ranks this record by (:func:`ranked_accuracy`)."""
        return ranked_accuracy(self)

    @property
    def accuracy_is_clients_mean(self) -> bool:
        """Whether :attr:`ranked_accuracy` is the clients' own models' mean."""
        return accuracy_is_clients_mean(self)

    def _value(self, key: str) -> Any:
        if key in self.extras:
            return self.extras[key]
        return getattr(self, key)

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys_written:
            raise KeyError(key)
        return _thawed(self._value(key))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_written)

    def __len__(self) -> int:
        return len(self.keys_written)

    def __contains__(self, key: object) -> bool:
        return key in self.keys_written

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping of mutable JSON: not hashable


def ranked_accuracy(r: Mapping[str, Any]) -> float | None:
    """The accuracy a table ranks a record by: the server predictor's
    (``global_test_accuracy``) where it has one, else the mean of the clients'
    own models (``mean_client_accuracy``: ``local``), else ``None``
    (``train_clients``: no accuracy)."""
    acc = r.get("global_test_accuracy")
    return r.get("mean_client_accuracy") if acc is None else acc


def accuracy_is_clients_mean(r: Mapping[str, Any]) -> bool:
    """Whether :func:`ranked_accuracy` of ``r`` is its clients' own models' mean."""
    return r.get("global_test_accuracy") is None and r.get("mean_client_accuracy") is not None


# --------------------------------------------------------------------------- versions
def migrate(r: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A record of file version ``version`` as the current version writes it.

    1 -> 2: an own-models record (``mean_client_accuracy`` present and equal to
    ``global_test_accuracy``) had the clients' mean as its accuracy; it becomes
    the server predictor's ``server_accuracy`` (``None`` without one: ``local``).
    """
    out = dict(r)
    if version < 2 and "mean_client_accuracy" in out:
        mean, acc = out["mean_client_accuracy"], out.get("global_test_accuracy")
        if acc is not None and acc == mean:
            out["global_test_accuracy"] = out.get("server_accuracy")
    return out


def file_version(doc: Mapping[str, Any]) -> int:
    """The ``schema_version`` of a ``metrics.json`` document (absent: 1);
    :class:`RecordError` on one this code cannot read."""
    version = doc.get("schema_version", 1)
    if not _integer(version):
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


def as_json(r: Mapping[str, Any]) -> dict[str, Any]:
    """A record, typed or not, as the JSON object ``metrics.json`` holds."""
    return r.to_dict() if isinstance(r, RunRecord) else dict(r)
