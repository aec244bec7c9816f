"""Weights & Biases: one W&B run per ``osfl run`` (``wandb.init(dir=RUN_DIR)``,
so offline runs land in ``RUN_DIR/wandb/``).

One run, not one per method and seed, so that the final table, the config and
every curve of an experiment stay together and a resume continues the same
run. W&B's own step only grows, and the methods of a run each start again at
round 0, so every record's scalars ``<method>/seed<k>/<metric>`` have their own
x axis, ``<method>/seed<k>/round`` (``define_metric``). A record's final
numbers go to the run summary as ``<method>/seed<k>/final/<metric>``; the
final table is a ``wandb.Table`` logged as ``summary_table``.

``WANDB_MODE`` is W&B's own switch (``offline``: nothing leaves the machine,
``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later; ``disabled``: no
files at all); ``WANDB_PROJECT`` names the project (default ``osfl``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from osfl.record import RunRecord
from osfl.trackers.base import (
    TRACKERS,
    RunInfo,
    SummaryTable,
    Tracker,
    record_scalars,
    tag_prefix,
)


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """Logs into one W&B run; its id is kept so that a resume continues it."""

    package = "wandb"
    extra = "wandb"

    def __init__(self) -> None:
        self.run: Any = None
        self.table_type: Any = None
        self._axes: set[str] = set()

    def start(self, info: RunInfo) -> str | None:
        import wandb  # optional: the wandb extra

        self.table_type = wandb.Table
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "osfl"),
            name=info.name,
            dir=str(info.run_dir),
            config=dict(info.config),
            mode=os.environ.get("WANDB_MODE", "online"),
            id=info.resume_id,
            resume="allow" if info.resume_id else None,
            # the terminal belongs to osfl's progress board; run.log keeps the log
            settings=wandb.Settings(console="off"),
        )
        return str(self.run.id)

    def _axis(self, prefix: str) -> str:
        """``<prefix>/round``, declared the x axis of ``<prefix>/*`` on first use."""
        axis = f"{prefix}/round"
        if axis not in self._axes:
            self.run.define_metric(axis, hidden=True)
            self.run.define_metric(f"{prefix}/*", step_metric=axis)
            self._axes.add(axis)
        return axis

    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        prefix = tag_prefix(method, seed, point)
        axis = self._axis(prefix)
        self.run.log({axis: round, **{f"{prefix}/{k}": v for k, v in metrics.items()}})

    def log_record(self, record: RunRecord) -> None:
        prefix = tag_prefix(record.method, record.seed, record.point) + "/final"
        self.run.summary.update({f"{prefix}/{k}": v for k, v in record_scalars(record).items()})

    def finish(self, summary: SummaryTable) -> None:
        table = self.table_type(columns=summary.columns, data=summary.rows)
        self.run.log({"summary_table": table})
        self.close(failed=False)

    def close(self, failed: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None
