"""Experiment trackers: ``logger: [tensorboard, wandb, mlflow]`` in a config
writes a run's per-round metrics and final table where a researcher looks for
them (docs/trackers.md).

None is required: each backend's package is an optional extra
(``pip install "osfl[tensorboard]"``), imported only when a run names it.
:mod:`~osfl.trackers.base` is the contract and the registry,
:mod:`~osfl.trackers.group` drives a run's backends as one, and one module
per backend registers itself here on import.
"""

from __future__ import annotations

from osfl.trackers import mlflow, tensorboard, wandb  # noqa: F401  (register the backends)
from osfl.trackers.base import (
    TRACKERS,
    RunInfo,
    SummaryTable,
    Tracker,
    record_scalars,
    round_scalars,
    tag_prefix,
)
from osfl.trackers.group import TrackerGroup, check_installed, missing_extras

__all__ = [
    "TRACKERS",
    "RunInfo",
    "SummaryTable",
    "Tracker",
    "TrackerGroup",
    "check_installed",
    "missing_extras",
    "record_scalars",
    "round_scalars",
    "tag_prefix",
]
