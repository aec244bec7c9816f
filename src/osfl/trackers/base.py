"""The tracker contract: what ``osfl run`` hands an experiment tracker.

A researcher looks for a run's curves in TensorBoard, Weights & Biases or
MLflow, not only in ``metrics.json``. Each backend is one :class:`Tracker`
class in :data:`TRACKERS` (``logger: [tensorboard, wandb, mlflow]`` names
them), and the run calls the same four methods on each: :meth:`Tracker.start`
once, :meth:`Tracker.log_round` after every evaluated round of a multi-round
method, :meth:`Tracker.log_record` for every finished record and
:meth:`Tracker.finish` with the final table. The values handed over are the
ones ``metrics.json`` holds (:func:`round_scalars`, :func:`record_scalars`),
so a tracker never shows a number the run directory does not.

Backends import their package inside their methods: none is required, and
:attr:`Tracker.package` names what :func:`osfl.trackers.group.check_installed`
looks for before any client trains.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from osfl.record import RunRecord
from osfl.registry import Registry


@dataclass(frozen=True)
class RunInfo:
    """What a tracker knows of the run when it starts.

    ``config``: the resolved config as plain data (``config_yaml`` as the run
    directory's ``config.yaml`` shows it). ``resume_id``: the id this backend
    gave the run when it started, read back on ``osfl run --resume`` so that
    the backend continues its own run instead of opening a second one
    (``None``: a new run)."""

    name: str
    run_dir: Path
    command: str
    config: Mapping[str, Any]
    config_yaml: str = ""
    resume_id: str | None = None


@dataclass(frozen=True)
class SummaryTable:
    """The run's final table: ``summary.md`` as ``markdown``, and the same
    mean ± std table as ``columns`` and text ``rows`` (``report.table_rows``)."""

    markdown: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


class Tracker(ABC):
    """One experiment-tracking backend.

    ``package``: the module the backend imports; ``extra``: the osfl extra
    that installs it (``pip install "osfl[<extra>]"``)."""

    package: ClassVar[str]
    extra: ClassVar[str]

    @abstractmethod
    def start(self, info: RunInfo) -> str | None:
        """Open the backend's run; returns its id (kept in ``trackers.json``
        for a resume), or ``None`` when the backend needs none."""

    @abstractmethod
    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        """One evaluated round of a multi-round method (``round`` from 0)."""

    @abstractmethod
    def log_record(self, record: RunRecord) -> None:
        """A finished record (one grid point × method × seed)."""

    @abstractmethod
    def finish(self, summary: SummaryTable) -> None:
        """The final table; the backend's run ends here."""

    @abstractmethod
    def close(self, failed: bool) -> None:
        """End the backend's run without a table (the run stopped early when
        ``failed``); called after :meth:`finish` too, so it must be idempotent."""


#: ``logger: [name, ...]`` -> the backend class (registered by each backend module)
TRACKERS: Registry[type[Tracker]] = Registry("logger")


def tag_prefix(method: str, seed: int, point: str = "") -> str:
    """``fedavg/seed0``, or ``train.lr=0.1,seeds=0/fedavg/seed0`` in a grid:
    the prefix of every scalar one record logs."""
    head = ",".join(point.split()) + "/" if point else ""
    return f"{head}{method}/seed{seed}"


def _scalar(value: Any) -> float | None:
    """A finite number as a float; ``None`` for anything else (bools too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


#: A round's own counters (``RoundRecord``), logged beside its metrics.
ROUND_COUNTERS = ("bytes_up", "bytes_down", "bytes_refused", "time_client_s", "time_server_s")
#: Numeric evaluation entries that are no curve (the test set's size).
NOT_CURVES = ("num_samples",)


def round_scalars(round_record: Mapping[str, Any]) -> dict[str, float]:
    """A round as the run saw it (``RoundRecord.as_dict()``) -> its scalars:
    every numeric evaluation metric under the name the round event, the
    record's ``curve`` and ``metrics.json`` give it (``global_test_accuracy``:
    the server predictor's; ``mean_client_accuracy``: the clients' own
    models' mean, where they have models of their own), ``accuracy``: the
    one the tables rank (the server predictor's, else the clients' mean:
    :attr:`osfl.record.CurvePoint.ranked_accuracy`), and the round's bytes
    and seconds."""
    metrics = round_record.get("metrics") or {}
    out: dict[str, float] = {}
    ranked = _scalar(metrics.get("global_test_accuracy"))
    ranked = _scalar(metrics.get("mean_client_accuracy")) if ranked is None else ranked
    if ranked is not None:
        out["accuracy"] = ranked
    for key, value in metrics.items():
        number = _scalar(value)
        if number is not None and key not in NOT_CURVES:
            out[key] = number
    for key in ROUND_COUNTERS:
        number = _scalar(round_record.get(key))
        if number is not None:
            out[key] = number
    return out


def record_scalars(record: RunRecord) -> dict[str, float]:
    """A finished record's headline numbers: ``accuracy`` (what the tables
    rank, :attr:`RunRecord.ranked_accuracy`), the accuracies it holds under
    their record names, bytes and the total seconds."""
    values = {
        "accuracy": record.ranked_accuracy,
        "global_test_accuracy": record.global_test_accuracy,
        "mean_client_accuracy": record.mean_client_accuracy,
        "local_test_accuracy": record.local_test_accuracy,
        "mean_client_local_test_accuracy": record.mean_client_local_test_accuracy,
        "bytes_up": record.bytes_up,
        "bytes_down": record.bytes_down,
        "time_s": record.total_seconds,
    }
    return {k: v for k, v in ((k, _scalar(v)) for k, v in values.items()) if v is not None}


def last_round(record: RunRecord) -> int:
    """The step a record's final numbers are logged at: its last round."""
    rounds = record.rounds
    return rounds - 1 if rounds is not None and rounds > 0 else 0


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"epochs": 1}}`` -> ``{"train.epochs": 1}`` (lists and empty
    mappings are leaves): a config as the flat parameters MLflow takes."""
    if not isinstance(node, Mapping):
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, Mapping) and v else {key: v})
    return out


_UNSAFE = re.compile(r"[^\w\-./ ]")


def safe_key(key: str) -> str:
    """``key`` with every character outside letters, digits, ``_ - . / space``
    as ``_`` (the names MLflow accepts; a grid point's ``=`` is not one)."""
    return _UNSAFE.sub("_", key)


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in pieces of at most ``size`` (a backend's batch limit)."""
    return [items[i : i + size] for i in range(0, len(items), size)]
