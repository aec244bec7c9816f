"""TensorBoard: event files under ``RUN_DIR/tensorboard/`` (``tensorboard
--logdir RUN_DIR/tensorboard``), written by torch's ``SummaryWriter``.

Scalars are tagged ``<method>/seed<k>/<metric>`` (a grid point's label in
front, :func:`~osfl.trackers.base.tag_prefix`) with the round as step; a
record's final numbers are ``<method>/seed<k>/final/<metric>`` at its last
round; the config and the summary table are text. A resume appends a new
event file to the same folder with the records it finishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from osfl.record import RunRecord
from osfl.trackers.base import (
    TRACKERS,
    RunInfo,
    SummaryTable,
    Tracker,
    last_round,
    record_scalars,
    tag_prefix,
)

#: The folder under the run directory that holds the event files.
FOLDER = "tensorboard"


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """Writes one event file per ``osfl run`` process into ``RUN_DIR/tensorboard``."""

    package = "tensorboard"
    extra = "tensorboard"

    def __init__(self) -> None:
        self.writer: Any = None

    def start(self, info: RunInfo) -> str | None:
        # optional: tensorboard (torch's writer needs it); heavy: torch
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(info.run_dir / FOLDER))
        if info.config_yaml:  # four spaces: TensorBoard shows the text as code
            config = "\n".join("    " + line for line in info.config_yaml.splitlines())
            self.writer.add_text("config", config, global_step=0)
        return None

    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        prefix = tag_prefix(method, seed, point)
        for key, value in metrics.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, global_step=round)
        self.writer.flush()

    def log_record(self, record: RunRecord) -> None:
        prefix = tag_prefix(record.method, record.seed, record.point) + "/final"
        step = last_round(record)
        for key, value in record_scalars(record).items():
            self.writer.add_scalar(f"{prefix}/{key}", value, global_step=step)
        self.writer.flush()

    def finish(self, summary: SummaryTable) -> None:
        self.writer.add_text("summary", summary.markdown, global_step=0)
        self.close(failed=False)

    def close(self, failed: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
