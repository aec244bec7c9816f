"""A run's trackers as one (osfl.trackers.group): the names ``logger`` may
hold, a missing extra refused in one line before anything trains, a backend
that cannot start, each backend's run id kept for a resume, and every
backend closed however the run ends."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.record import RunRecord
from osfl.trackers import RunInfo, SummaryTable, Tracker, TrackerGroup, check_installed
from support.paths import ROOT
from support.smoke import exit_2, tiny_cli_args


class Recorder(Tracker):
    """A backend that records what it is handed (``fail``: ``start`` raises)."""

    package = "json"
    extra = "recorder"

    def __init__(self, run_id: str | None = "r1", fail: bool = False) -> None:
        self.run_id, self.fail = run_id, fail
        self.calls: list[tuple[object, ...]] = []

    def start(self, info: RunInfo) -> str | None:
        if self.fail:
            raise RuntimeError("api key not configured")
        self.calls.append(("start", info.resume_id))
        return self.run_id

    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        self.calls.append(("round", method, seed, point, round, dict(metrics)))

    def log_record(self, record: RunRecord) -> None:
        self.calls.append(("record", record.method))

    def finish(self, summary: SummaryTable) -> None:
        self.calls.append(("finish", summary.markdown))

    def close(self, failed: bool) -> None:
        self.calls.append(("close", failed))


def _group(**trackers: Tracker) -> TrackerGroup:
    group = TrackerGroup([])
    group.trackers = dict(trackers)
    return group


def _info(tmp_path: Path) -> RunInfo:
    return RunInfo("demo", tmp_path, "osfl run", {"name": "demo"})


def test_logger_is_empty_by_default_and_takes_registered_names_once() -> None:
    assert load_config().logger == []
    assert load_config(None, ["logger=[TensorBoard,mlflow]"]).logger == ["TensorBoard", "mlflow"]
    with pytest.raises(ConfigError) as e:
        load_config(None, ["logger=[tensorbord]"])
    assert str(e.value) == (
        "unknown logger 'tensorbord' (did you mean 'tensorboard'?); "
        "valid: mlflow, tensorboard, wandb"
    )
    with pytest.raises(ConfigError, match=r"^logger names wandb more than once$"):
        load_config(None, ["logger=[wandb,WandB]"])


def test_a_missing_extra_is_one_line_naming_its_pip_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec: None, as if not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError) as e:
        check_installed(["wandb", "mlflow", "wandb"])
    assert str(e.value) == (
        'logger: wandb, mlflow are not installed: pip install "osfl[wandb,mlflow]" '
        "(or drop them from logger)"
    )
    check_installed([])


def test_osfl_run_refuses_a_missing_extra_before_anything_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    line = exit_2(capsys, ["run", *tiny_cli_args(tmp_path), "logger=[wandb]", "--out", str(out)])
    assert line == (
        'osfl: error: logger: wandb is not installed: pip install "osfl[wandb]" '
        "(or drop it from logger)"
    )
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_backend_that_cannot_start_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _group(broken=Recorder(fail=True)).start(_info(tmp_path), resumed=False)
    assert str(e.value) == "logger: broken did not start: RuntimeError: api key not configured"


def test_run_ids_are_kept_and_handed_back_on_a_resume(tmp_path: Path) -> None:
    """``trackers.json`` holds each backend's id; a resume hands it back; a
    backend that keeps none (TensorBoard) is not written; a new run reads nothing."""
    first = _group(a=Recorder("id-a"), b=Recorder(None))
    first.start(_info(tmp_path), resumed=False)
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"a": "id-a"}
    again = _group(a=Recorder("id-a"), b=Recorder(None))
    again.start(_info(tmp_path), resumed=True)
    assert [t.calls for t in again.trackers.values()] == [[("start", "id-a")], [("start", None)]]
    fresh = _group(a=Recorder("id-new"))
    fresh.start(_info(tmp_path), resumed=False)
    assert fresh.trackers["a"].calls == [("start", None)]  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"a": "id-new"}
    (tmp_path / "trackers.json").write_text("[not an object")  # issue 51: refused, not ignored
    damaged = _group(a=Recorder("id-2"))
    with pytest.raises(ConfigError, match=r"trackers\.json is not valid JSON .*"):
        damaged.start(_info(tmp_path), resumed=True)
    assert damaged.trackers["a"].calls == []  # type: ignore[attr-defined]


def test_every_backend_is_called_in_order_and_closed_however_the_run_ends(
    tmp_path: Path,
) -> None:
    a, b = Recorder(), Recorder()
    record = RunRecord.from_dict({"method": "fedavg", "seed": 0})
    with _group(a=a, b=b) as group:
        group.start(_info(tmp_path), resumed=False)
        group.log_round("fedavg", 0, "", 2, {"accuracy": 0.5})
        group.log_record(record)
        group.finish(SummaryTable("# table"))
    expected = [
        ("start", None),
        ("round", "fedavg", 0, "", 2, {"accuracy": 0.5}),
        ("record", "fedavg"),
        ("finish", "# table"),
        ("close", False),
    ]
    assert a.calls == b.calls == expected
    stopped = Recorder()
    with pytest.raises(KeyboardInterrupt), _group(s=stopped) as group:
        group.start(_info(tmp_path), resumed=False)
        raise KeyboardInterrupt
    assert stopped.calls == [("start", None), ("close", True)]


def test_the_docs_examples_load_with_the_loggers_they_name() -> None:
    """docs/trackers.md's ``osfl run`` commands: their overrides make a config
    (no key renamed under them) with the loggers the page says."""
    text = (ROOT / "docs" / "trackers.md").read_text().replace("\\\n", " ")
    commands = [line.split("osfl run", 1)[1] for line in text.splitlines() if "osfl run '" in line]
    loggers = []
    for command in commands:
        overrides = [a for a in shlex.split(command) if "=" in a and not a.startswith("--")]
        loggers.append(load_config(None, overrides).logger)
    assert loggers == [["tensorboard"], ["wandb", "mlflow"]]
