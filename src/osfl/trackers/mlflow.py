"""MLflow: one MLflow run per ``osfl run``, in the tracking store
``MLFLOW_TRACKING_URI`` names, else a SQLite store in the run directory
(``RUN_DIR/mlflow.db``, artifacts under ``RUN_DIR/mlartifacts``; ``mlflow ui
--backend-store-uri sqlite:///RUN_DIR/mlflow.db``). Not a ``./mlruns`` file
store: MLflow 3 refuses to open one unless ``MLFLOW_ALLOW_FILE_STORE=true``
(a user who sets both variables gets one).

Parameters are the resolved config flattened (``train.lr``, ...); metrics are
``<method>/seed<k>/<metric>`` per round with the round as step, and
``<method>/seed<k>/final/<metric>`` at a record's last round; the summary
is the artifact ``summary.md`` (and ``summary_table.json``: its columns and
rows). The experiment is ``MLFLOW_EXPERIMENT_NAME`` (default ``osfl``). A
resume continues the same MLflow run (its id is in ``trackers.json``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from osfl.record import RunRecord
from osfl.trackers.base import (
    TRACKERS,
    RunInfo,
    SummaryTable,
    Tracker,
    chunks,
    flatten,
    last_round,
    record_scalars,
    safe_key,
    tag_prefix,
)

#: The tracking store and the artifacts in the run directory (no MLFLOW_TRACKING_URI)
DATABASE, ARTIFACTS = "mlflow.db", "mlartifacts"
#: MLflow's limits: characters of a parameter's value, entries of one log_batch
MAX_PARAM_CHARS = 6000
MAX_BATCH = 100


def _param_text(value: Any) -> str:
    """A config value as the text MLflow stores (YAML-like JSON for lists)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_CHARS]


@TRACKERS.register("mlflow")
class MlflowTracker(Tracker):
    """Logs through ``MlflowClient`` (no global active run: osfl sets none)."""

    package = "mlflow"
    extra = "mlflow"

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""
        self._metric: Any = None

    def start(self, info: RunInfo) -> str | None:
        from mlflow.entities import Metric, Param  # optional: the mlflow extra
        from mlflow.tracking import MlflowClient  # optional: the mlflow extra

        here = info.run_dir.resolve()
        given = os.environ.get("MLFLOW_TRACKING_URI")
        uri = given or f"sqlite:///{here / DATABASE}"
        self.client, self._metric = MlflowClient(tracking_uri=uri), Metric
        if info.resume_id is not None:  # its parameters are logged (and may not change)
            self.run_id = info.resume_id
            self.client.update_run(self.run_id, status="RUNNING")
            return self.run_id
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "osfl")
        found = self.client.get_experiment_by_name(name)
        # the store in the run directory keeps the artifacts beside it; a server its own place
        local = None if given else (here / ARTIFACTS).as_uri()
        experiment = found.experiment_id if found else self.client.create_experiment(name, local)
        tags = {"osfl.run_dir": str(here), "osfl.command": info.command}
        run = self.client.create_run(experiment, run_name=info.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, _param_text(v)) for k, v in flatten(info.config).items()]
        for part in chunks(params, MAX_BATCH):
            self.client.log_batch(self.run_id, params=part)
        return self.run_id

    def _log(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [
            self._metric(safe_key(f"{prefix}/{k}"), float(v), now, step) for k, v in values.items()
        ]
        for part in chunks(metrics, MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=part)

    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        self._log(tag_prefix(method, seed, point), metrics, round)

    def log_record(self, record: RunRecord) -> None:
        prefix = tag_prefix(record.method, record.seed, record.point) + "/final"
        self._log(prefix, record_scalars(record), last_round(record))

    def finish(self, summary: SummaryTable) -> None:
        self.client.log_text(self.run_id, summary.markdown, "summary.md")
        table = {"columns": summary.columns, "rows": summary.rows}
        self.client.log_dict(self.run_id, table, "summary_table.json")
        self.client.set_terminated(self.run_id, "FINISHED")
        self.client = None

    def close(self, failed: bool) -> None:
        if self.client is not None:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
            self.client = None
