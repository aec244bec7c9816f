"""The typed run record, :class:`RunRecord`, and its curve's points,
:class:`CurvePoint` (``docs/run-directory.md``; the package docstring says
why it is also a read-only ``Mapping``, for export only)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from osfl.record.fields import (
    REQUIRED_FIELDS,
    RecordError,
    check_record,
    frozen,
    integer,
    number,
    plain,
)

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _default(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default value."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


#: A curve point's typed keys, in the order it writes them.
_POINT_KEYS = (
    "round",
    "global_test_accuracy",
    "mean_client_accuracy",
    "bytes",
    "seconds",
    "validation_accuracy",
    "mean_client_validation_accuracy",
)


@dataclass(frozen=True)
class CurvePoint:
    """One evaluated round of a record's ``curve``: its accuracies under the
    record's names, and the bytes (up + down) and compute seconds spent up to
    the end of it (``None``: a record written before they were counted)."""

    round: int
    #: the server predictor's test accuracy (``None``: ``local``, no server predictor)
    global_test_accuracy: float | None = None
    #: the clients' own models' mean (``local``, OwnModels)
    mean_client_accuracy: float | None = None
    bytes: float | None = None
    seconds: float | None = None
    validation_accuracy: float | None = None
    mean_client_validation_accuracy: float | None = None
    #: keys of a point this code does not know, kept as written
    extras: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @property
    def ranked_accuracy(self) -> float | None:
        """The accuracy of this round a table would rank (:func:`ranked_accuracy`)."""
        acc = self.global_test_accuracy
        return self.mean_client_accuracy if acc is None else acc

    @property
    def ranked_key(self) -> str:
        """The name of :attr:`ranked_accuracy`."""
        if self.global_test_accuracy is not None:
            return "global_test_accuracy"
        return "mean_client_accuracy"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CurvePoint:
        """A point of a current-version curve; :class:`RecordError` (field
        ``curve``) for a point without an integer round or a non-number."""
        if "accuracy" in d:
            raise RecordError(
                "field 'curve' has a point with 'accuracy', a key of schema version 2 or "
                "older (osfl.report.read_metrics migrates such a file)",
                "curve",
            )
        if not integer(d.get("round")):
            raise RecordError("field 'curve' has a point without an integer 'round'", "curve")
        bad = [k for k in _POINT_KEYS[1:] if k in d and not number(d[k])]
        if bad:
            raise RecordError(
                f"field 'curve' has a point whose {bad[0]!r} is not a number", "curve"
            )
        known = {k: d[k] for k in _POINT_KEYS if k in d}
        extras = {k: frozen(v) for k, v in d.items() if k not in _POINT_KEYS}
        return cls(**known, extras=MappingProxyType(extras))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``round`` and ``global_test_accuracy`` always (null
        without a server predictor), the other keys where set."""
        out: dict[str, Any] = {}
        for k in _POINT_KEYS:
            v = getattr(self, k)
            if v is not None or k in ("round", "global_test_accuracy"):
                out[k] = v
        return {**out, **plain(self.extras)}


@dataclass(frozen=True, eq=False)
class RunRecord(Mapping[str, Any]):
    """One method × seed × grid point result (``docs/run-directory.md``).

    Typed fields are the ones osfl ranks, sums, compares and plots: its
    readers use them, never ``record["key"]`` (the ``Mapping`` view is for
    export: see the module docstring). Every other key is in ``extras``.
    ``keys_written`` is the record's key order, so that :meth:`to_dict` gives
    back exactly what was built or read (an absent optional field stays
    absent: ``None`` below means "not recorded" unless the key is in
    ``keys_written``)."""

    method: str
    seed: int
    point: str = ""
    #: the grid point's overrides, key -> value text (``{}`` without a sweep)
    sweep: Mapping[str, Any] | None = None
    #: what the numbers presuppose (osfl.fl.regimes); "" for records before regimes
    regime: str = ""
    #: the server predictor's test accuracy; ``None``: no server predictor
    #: (``local``), or no accuracy at all (``train_clients``)
    global_test_accuracy: float | None = None
    #: the mean test accuracy of the clients' own models (``local``, OwnModels)
    mean_client_accuracy: float | None = None
    #: the server predictor's accuracy on each client's label mix, their mean
    local_test_accuracy: float | None = None
    #: the same of each client's own model on its own mix (``local``, OwnModels), their mean
    mean_client_local_test_accuracy: float | None = None
    #: the test samples the accuracies were computed on
    num_samples: int | None = None
    bytes_up: float | None = None
    bytes_down: float | None = None
    time_s: Mapping[str, float | None] = field(default_factory=lambda: _EMPTY)
    warnings: tuple[str, ...] = ()
    curve: tuple[CurvePoint, ...] = ()
    #: rounds run
    rounds: int | None = None
    #: ``"sites"`` where the sites scored the final model on their own test sets
    evaluated_at: str | None = None
    #: the local-training recipe; ``None`` for a method that trains no recipe
    train: Mapping[str, Any] | None = None
    method_config: Mapping[str, Any] | None = None
    partition: Mapping[str, Any] | None = None
    #: the task (data, model, transform) the grid point ran
    task: Mapping[str, Any] | None = None
    #: what the numbers were computed with (environment, data hashes)
    provenance: Mapping[str, Any] | None = None
    #: the config's ``server`` rules the run aggregated under
    server_rules: Mapping[str, Any] | None = None
    #: rounds and time to a target (:mod:`osfl.convergence`)
    convergence: Mapping[str, Any] | None = None
    #: the evaluated round with the best validation accuracy
    best_on_validation: Mapping[str, Any] | None = None
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
        values = {k: frozen(v) for k, v in d.items() if k in typed and k != "curve"}
        if "curve" in d:
            values["curve"] = tuple(CurvePoint.from_dict(p) for p in d["curve"])
        extras = {k: frozen(v) for k, v in d.items() if k not in typed}
        return cls(**values, extras=MappingProxyType(extras), keys_written=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``metrics.json`` holds, keys in their written order."""
        return {k: plain(self._value(k)) for k in self.keys_written}

    def replace(self, **changes: Any) -> RunRecord:
        """This record with keys set (added at the end when new), validated again."""
        return RunRecord.from_dict({**self.to_dict(), **changes})

    def without(self, *keys: str) -> RunRecord:
        """This record with ``keys`` left out."""
        return RunRecord.from_dict({k: v for k, v in self.to_dict().items() if k not in keys})

    # ------------------------------------------------------------------ reading
    @property
    def ranked_accuracy(self) -> float | None:
        """What a table ranks this record by: the server predictor's
        accuracy where it has one, else its clients' own models' mean
        (``local``), else ``None`` (``train_clients``: no accuracy)."""
        acc = self.global_test_accuracy
        return self.mean_client_accuracy if acc is None else acc

    @property
    def accuracy_is_clients_mean(self) -> bool:
        """Whether :attr:`ranked_accuracy` is the clients' own models' mean."""
        return self.global_test_accuracy is None and self.mean_client_accuracy is not None

    @property
    def total_seconds(self) -> float | None:
        """``time_s.total``: the seconds the job took."""
        return self.time_s.get("total")

    @property
    def test_set(self) -> str | None:
        """The content hash of the test images the record was scored on."""
        data = (self.provenance or {}).get("data") or {}
        return data.get("test")

    @property
    def partition_key(self) -> str | None:
        """The split's content hash (``None``: a record written before splits were keyed)."""
        key = (self.partition or {}).get("key")
        return None if key is None else str(key)

    def extra(self, key: str, default: Any = None) -> Any:
        """An untyped key a method or run wrote (``server``, ``sweep``, ...),
        as plain JSON (``default`` when absent)."""
        return plain(self.extras[key]) if key in self.extras else default

    def _value(self, key: str) -> Any:
        if key in self.extras:
            return self.extras[key]
        if key == "curve":
            return [p.to_dict() for p in self.curve]
        return getattr(self, key)

    # ------------------------------------------------- the export view (Mapping)
    def __getitem__(self, key: str) -> Any:
        if key not in self.keys_written:
            raise KeyError(key)
        return plain(self._value(key))

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


def typed(records: Sequence[RunRecord | Mapping[str, Any]]) -> list[RunRecord]:
    """``records`` as :class:`RunRecord` objects (plain current-version
    objects are read with :meth:`RunRecord.from_dict`): what every reader
    that takes records calls first, so that it reads attributes only."""
    return [r if isinstance(r, RunRecord) else RunRecord.from_dict(r) for r in records]
