"""``logger=[tensorboard]``: a tiny ``osfl run`` whose event files, read back
with TensorBoard's own reader, hold the numbers of its ``metrics.json``
(osfl.trackers.tensorboard). TensorBoard is in the dev extra, so CI runs this."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from osfl.cli import main
from support.smoke import tiny_cli_args
from support.tracked_run import records_by_method, resume_without_local, run_with_logger

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="the tensorboard extra"
)

event_file_loader = pytest.importorskip(
    "tensorboard.backend.event_processing.event_file_loader", reason="the tensorboard extra"
)


def _events(out: Path) -> Any:
    acc = event_accumulator.EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return acc


def _scalars(acc: Any, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _tags(path: Path) -> set[str]:
    """The scalar tags one event file holds."""
    loader = event_file_loader.EventFileLoader(str(path))
    return {
        v.tag
        for e in loader.Load()
        for v in e.summary.value
        if v.metadata.plugin_data.plugin_name == "scalars"
    }


def _f32(x: float) -> float:
    """What an event file holds of ``x``: TensorBoard's scalars are float32."""
    return float(np.float32(x))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_with_logger(tmp_path_factory.mktemp("tensorboard"), "tensorboard")


def test_every_rounds_accuracy_is_the_records_curve(run: Path) -> None:
    """FedAvg's three rounds: ``fedavg/seed0/accuracy`` (the ranked one) and
    ``fedavg/seed0/global_test_accuracy`` at steps 0, 1, 2 are the record's
    ``curve``, value for value, under the curve's name."""
    fedavg = records_by_method(run)["fedavg"]
    assert [p["round"] for p in fedavg["curve"]] == [0, 1, 2]
    curve = [(p["round"], _f32(p["global_test_accuracy"])) for p in fedavg["curve"]]
    assert _scalars(_events(run), "fedavg/seed0/accuracy") == curve
    assert _scalars(_events(run), "fedavg/seed0/global_test_accuracy") == curve


def test_every_record_logs_its_final_numbers_at_its_last_round(run: Path) -> None:
    records, acc = records_by_method(run), _events(run)
    fedavg, local = records["fedavg"], records["local"]
    assert _scalars(acc, "fedavg/seed0/final/accuracy") == [
        (2, _f32(fedavg["global_test_accuracy"]))
    ]
    assert _scalars(acc, "fedavg/seed0/final/bytes_up") == [(2, _f32(fedavg["bytes_up"]))]
    # local has no server predictor: the ranked accuracy is the clients' own mean
    assert _scalars(acc, "local/seed0/final/accuracy") == [(0, _f32(local["mean_client_accuracy"]))]
    assert "local/seed0/accuracy" not in acc.Tags()["scalars"]  # one-shot: no rounds


def test_the_summary_table_is_summary_md(run: Path) -> None:
    acc = _events(run)
    [event] = acc.Tensors("summary/text_summary")
    assert event.tensor_proto.string_val[0].decode() == (run / "summary.md").read_text()
    [config] = acc.Tensors("config/text_summary")
    assert "    logger:\n    - tensorboard" in config.tensor_proto.string_val[0].decode()


def test_a_resume_logs_only_the_records_it_finishes(tmp_path: Path) -> None:
    """A run whose ``local`` record is missing, resumed: a second event file
    holds ``local``'s scalars alone, and FedAvg's rounds and final numbers stay once."""
    out = run_with_logger(tmp_path, "tensorboard")
    resume_without_local(tmp_path, "tensorboard", out)
    first, second = sorted((out / "tensorboard").glob("events.out.tfevents.*"))
    assert {t.split("/")[0] for t in _tags(first)} == {"fedavg", "local"}
    assert {t.split("/")[0] for t in _tags(second)} == {"local"}
    acc, fedavg = _events(out), records_by_method(out)["fedavg"]
    assert [s for s, _ in _scalars(acc, "fedavg/seed0/accuracy")] == [0, 1, 2]
    assert _scalars(acc, "fedavg/seed0/final/accuracy") == [
        (2, _f32(fedavg["global_test_accuracy"]))
    ]
    # dropped by hand after the first run had logged it: both runs' (equal) values
    local = _f32(records_by_method(out)["local"]["mean_client_accuracy"])
    assert _scalars(acc, "local/seed0/final/accuracy") == [(0, local), (0, local)]


def test_a_tracker_added_at_a_resume_sees_only_the_records_it_finishes(tmp_path: Path) -> None:
    """``logger`` changes no number: a run started without trackers resumes
    with one (the configs compare equal), which logs only ``local``."""
    out = tmp_path / "run"
    args = [*tiny_cli_args(tmp_path, "fedavg,local"), "eval_every=1", "method.fedavg.rounds=3"]
    assert main(["run", *args, "--out", str(out)]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["method"] != "local"]
    (out / "metrics.json").write_text(json.dumps(doc))
    assert main(["run", *args, "logger=[tensorboard]", "--resume", str(out)]) == 0
    [events] = (out / "tensorboard").glob("events.out.tfevents.*")
    assert {t.split("/")[0] for t in _tags(events)} == {"local"}
    assert "logger: []" in (out / "config.yaml").read_text()  # the run's config stays
