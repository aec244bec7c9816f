"""``logger=[mlflow]``: a tiny ``osfl run`` into MLflow's store in the run
directory, read back with ``MlflowClient`` (osfl.trackers.mlflow). MLflow is
an optional extra: skipped where it is not installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support.tracked_run import records_by_method, resume_without_local, run_with_logger

tracking = pytest.importorskip("mlflow.tracking", reason="the mlflow extra")


@pytest.fixture(autouse=True)
def _local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store in the run directory, whatever the machine's environment says."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def _client(out: Path) -> tuple[Any, str]:
    """The run directory's MLflow store, and the run the osfl run logged into."""
    run_id = json.loads((out / "trackers.json").read_text())["mlflow"]
    return tracking.MlflowClient(tracking_uri=f"sqlite:///{out.resolve()}/mlflow.db"), run_id


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_the_run_holds_the_config_curves_finals_and_summary(tmp_path: Path) -> None:
    """Every number is the one metrics.json holds (float64, as written), and a
    resume continues the same MLflow run without logging FedAvg again."""
    out = run_with_logger(tmp_path, "mlflow")
    client, run_id = _client(out)
    run, records = client.get_run(run_id), records_by_method(out)
    assert run.info.status == "FINISHED" and run.info.run_name == "default"
    assert run.data.tags["osfl.run_dir"] == str(out.resolve())
    params = run.data.params
    assert params["train.epochs"] == "1" and params["partition.num_clients"] == "2"
    assert params["methods"] == '["fedavg", "local"]' and params["logger"] == '["mlflow"]'
    fedavg, local = records["fedavg"], records["local"]
    assert _history(client, run_id, "fedavg/seed0/accuracy") == [
        (p["round"], p["global_test_accuracy"]) for p in fedavg["curve"]
    ]
    assert _history(client, run_id, "fedavg/seed0/final/accuracy") == [
        (2, fedavg["global_test_accuracy"])
    ]
    assert _history(client, run_id, "local/seed0/final/accuracy") == [
        (0, local["mean_client_accuracy"])
    ]
    where = Path(client.download_artifacts(run_id, "summary.md", str(tmp_path)))
    assert where.read_text() == (out / "summary.md").read_text()
    table = json.loads(
        Path(client.download_artifacts(run_id, "summary_table.json", str(tmp_path))).read_text()
    )
    assert table["columns"][:3] == ["method", "seeds", "accuracy (%)"]
    assert [row[0] for row in table["rows"]] == ["fedavg", "local"]

    resume_without_local(tmp_path, "mlflow", out)
    assert _client(out)[1] == run_id
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [s for s, _ in _history(client, run_id, "fedavg/seed0/accuracy")] == [0, 1, 2]
    # dropped by hand after the first run had logged it: both runs' (equal) values
    assert (
        _history(client, run_id, "local/seed0/final/accuracy")
        == [(0, local["mean_client_accuracy"])] * 2
    )
