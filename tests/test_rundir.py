"""Run directories are never overwritten or mixed silently: a new run refuses
an existing one, ``--overwrite`` replaces only an osfl run, ``--resume`` runs
only the missing records of the same config, and a run that stops keeps every
finished record and says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfl.cli import main
from support.paths import ROOT
from support.smoke import exit_2, tiny_cli_args


def tiny(tmp_path: Path) -> list[str]:
    return tiny_cli_args(tmp_path)


def records(out: Path) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["records"]


def events(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def test_existing_run_is_refused_untouched(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    line = exit_2(capsys, ["run", *tiny(tmp_path), "--out", str(out)])
    assert "already holds an osfl run" in line and "--resume" in line and "--overwrite" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_finished_run_directory_holds_what_the_docs_list_and_no_empty_state(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert not (out / "state").exists()  # each job's resume state went with its record
    assert names == [
        "config.yaml",
        "events.jsonl",
        "frontier.png",
        "metrics.json",
        "models",
        "partition-seed0-" + names[5].removeprefix("partition-seed0-"),
        "run.log",
        "summary.md",
    ]
    documented = (ROOT / "docs" / "run-directory.md").read_text()
    for name in ("config.yaml", "events.jsonl", "frontier.png", "metrics.json", "run.log"):
        assert f"| `{name}` |" in documented
    assert "| `partition-seed<seed>-<key>.png` |" in documented
    assert "| `models/` |" in documented


def test_out_on_a_directory_of_other_files_asks_for_another_out(tmp_path, capsys) -> None:
    other = tmp_path / "mine"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    line = exit_2(capsys, ["run", *tiny(tmp_path), "--out", str(other)])
    assert line == (
        f"osfl: error: {other} is not empty and is not an osfl run directory: give --out a "
        "new or empty directory"
    )
    assert "--resume" not in line  # it holds no run to resume
    assert [p.name for p in other.iterdir()] == ["thesis.tex"]


def test_overwrite_replaces_an_old_run_and_nothing_else(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    (out / "observations").mkdir()
    (out / "audit.json").write_text("{}")  # left-overs of the old run must not mix in
    assert main(["run", *tiny(tmp_path), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "observations").exists() and not (out / "audit.json").exists()
    assert [e["event"] for e in events(out)].count("run_start") == 1
    other = tmp_path / "mine"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    line = exit_2(capsys, ["run", *tiny(tmp_path), "--out", str(other), "--overwrite"])
    assert "not an osfl run directory" in line
    assert (other / "thesis.tex").read_text() == "precious"


def test_resume_runs_only_the_missing_records(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    full = records(out)
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["method"] == "fedavg"]  # "killed" after it
    (out / "metrics.json").write_text(json.dumps(doc))
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    evs = events(out)
    resumed = [i for i, e in enumerate(evs) if e["event"] == "run_resumed"]
    assert len(resumed) == 1 and evs[resumed[0]]["finished"] == 1
    started = [e["method"] for e in evs[resumed[0] :] if e["event"] == "method_start"]
    assert started == ["ensemble"]
    again = records(out)
    assert [r["method"] for r in again] == ["fedavg", "ensemble"]
    assert again[0] == full[0]
    assert again[1]["global_test_accuracy"] == full[1]["global_test_accuracy"]


def test_a_run_started_before_an_upgrade_resumes(tmp_path) -> None:
    """A config.yaml written before osfl gained a key (here ``secagg``) is the
    same config: the key takes its default, and the resume goes on."""
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    text = (out / "config.yaml").read_text()
    start = text.index("\nsecagg:")
    end = text.index("\n", text.index("max_weight:", start) + 1)
    (out / "config.yaml").write_text(text[:start] + text[end:])
    assert "secagg" not in (out / "config.yaml").read_text()
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = doc["records"][:1]
    (out / "metrics.json").write_text(json.dumps(doc))
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert [r["method"] for r in records(out)] == ["fedavg", "ensemble"]


def test_resume_with_another_config_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "--out", str(out)]) == 0
    line = exit_2(capsys, ["run", "--resume", str(out), "train.epochs=2"])
    assert "differs from the run's config.yaml in train.epochs (2 here, 1 in the run)" in line
    line = exit_2(capsys, ["run", "--resume", str(out), "train.epochs=2", "train.lr=0.5"])
    assert "in train.epochs (2 here, 1 in the run), train.lr (0.5 here, " in line
    line = exit_2(capsys, ["run", "--resume", str(tmp_path / "nothing")])
    assert "there is no such directory; pass the folder `osfl run` printed" in line


def test_resume_from_the_wrong_directory_says_what_is_missing_and_what_to_pass(
    tmp_path, capsys
) -> None:
    """Issue 52: "(no config.yaml)" named neither what a run directory is nor
    what to pass; each wrong place now says both in one line."""
    parent = tmp_path / "runs"
    (parent / "20260101-120000-default").mkdir(parents=True)
    (parent / "20260101-120000-default" / "config.yaml").write_text("base: none\n")
    (parent / "20260101-120000-default" / "metrics.json").write_text("{}")
    line = exit_2(capsys, ["run", "--resume", str(parent)])
    assert "holds run directories, not a run; pass one of them" in line
    assert str(parent / "20260101-120000-default") in line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = exit_2(capsys, ["run", "--resume", str(empty)])
    assert "not an osfl run directory (no config.yaml, which every run writes first)" in line
    assert "pass the folder `osfl run` printed as `run directory: ...`" in line
    (empty / "metrics.json").write_text("{}")  # a run whose config.yaml was deleted
    line = exit_2(capsys, ["run", "--resume", str(empty)])
    assert "config.yaml is missing" in line and "start a new run" in line
    line = exit_2(capsys, ["run", "--resume", str(empty / "metrics.json")])
    assert "this is a file, not a run directory" in line


def test_a_failing_run_keeps_finished_records_and_says_why(tmp_path, monkeypatch) -> None:
    from osfl.methods.ensemble import Ensemble

    def broken(self, state):
        raise RuntimeError("predictor exploded")

    monkeypatch.setattr(Ensemble, "predictor", broken)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="exploded"):
        main(["run", *tiny(tmp_path), "--out", str(out)])
    assert [r["method"] for r in records(out)] == ["fedavg"]  # saved when it finished
    failed = [e for e in events(out) if e["event"] == "run_failed"]
    assert failed and failed[0]["reason"] == "predictor exploded"
    assert "run stopped: RuntimeError: predictor exploded" in (out / "run.log").read_text()


def test_a_multi_round_method_saves_every_round_and_nan_never_loses_a_record(
    tmp_path, monkeypatch
) -> None:
    """metrics.json holds the rounds of a running method (``in_progress``) and
    a NaN anywhere in a record is written as null, not a crash."""
    from osfl.methods.fedavg import FedAvg

    real = FedAvg.aggregate

    def third_round_fails(self, state, uploads, round):
        if round == 2:
            raise RuntimeError("round 3 exploded")
        return real(self, state, uploads, round)

    monkeypatch.setattr(FedAvg, "aggregate", third_round_fails)
    out = tmp_path / "run"
    args = [
        a if a != "methods=[fedavg,ensemble]" else "methods=[ensemble,fedavg]"
        for a in tiny(tmp_path)
    ]
    with pytest.raises(RuntimeError, match="exploded"):
        main(["run", *args, "method.fedavg.rounds=4", "--out", str(out)])
    doc = json.loads((out / "metrics.json").read_text())
    assert [r["method"] for r in doc["records"]] == ["ensemble"]
    running = doc["in_progress"]
    assert running["method"] == "fedavg" and [r["round"] for r in running["rounds"]] == [0, 1]

    from osfl import report

    report.write_metrics(
        out / "m.json", [{"method": "x", "seed": 0, "loss": float("nan")}], info={}
    )
    assert report.read_metrics(out / "m.json")["records"][0]["loss"] is None


def test_a_run_stopped_mid_method_resumes_at_its_round_with_the_same_numbers(
    tmp_path, monkeypatch
) -> None:
    """SCAFFOLD (clients keep state between rounds) stopped in round 3's
    aggregation resumes there: the uploads accepted before the stop are not
    asked again, the clients' states come back, and the numbers are those of
    the run that never stopped."""
    from osfl.methods.scaffold import Scaffold

    args = [
        *[a for a in tiny(tmp_path) if not a.startswith(("methods=", "cache_dir="))],
        "methods=[scaffold]",
        "method.scaffold.rounds=4",
        "cache_dir=null",
    ]
    main(["run", *args, "--out", str(tmp_path / "whole")])
    whole = records(tmp_path / "whole")[0]

    real = Scaffold.aggregate
    calls = {"n": 0}

    def stops_once_in_round_3(self, state, uploads, round):
        if round == 2 and calls["n"] == 0:
            calls["n"] += 1
            raise KeyboardInterrupt  # as if the user pressed ^C
        return real(self, state, uploads, round)

    monkeypatch.setattr(Scaffold, "aggregate", stops_once_in_round_3)
    out = tmp_path / "stopped"
    with pytest.raises(SystemExit) as stop:
        main(["run", *args, "--out", str(out)])
    assert stop.value.code == 130  # the shell's code for ^C
    state = out / "state" / "scaffold-seed0"
    assert (state / "resume.safetensors").is_file()
    assert len(list((state / "pending" / "round_002").glob("client_*.safetensors"))) == 2

    from osfl.methods import schemes

    trained = []
    real_train = schemes.train_local

    def counting(*a, **k):
        trained.append(1)
        return real_train(*a, **k)

    monkeypatch.setattr(schemes, "train_local", counting)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    resumed = records(out)[0]
    assert len(trained) == 2  # round 4's two clients only: round 3's uploads were kept
    assert resumed["global_test_accuracy"] == whole["global_test_accuracy"]
    assert resumed["bytes_up"] == whole["bytes_up"]
    assert not state.exists()  # the record is saved: the resume state is gone
    assert not (out / "state").exists()  # and state/ with it, the last job's


@pytest.mark.slow
def test_a_killed_run_resumes_with_the_same_numbers(tmp_path) -> None:
    """SIGKILL (no handler runs) after some rounds: ``--resume`` finishes the
    method from its saved state, with the uninterrupted run's numbers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = [
        *[a for a in tiny(tmp_path) if not a.startswith(("methods=", "cache_dir="))],
        "methods=[scaffold]",
        "method.scaffold.rounds=12",
        "cache_dir=null",
    ]
    main(["run", *args, "--out", str(tmp_path / "whole")])
    whole = records(tmp_path / "whole")[0]
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "osfl.cli", "run", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = out / "state" / "scaffold-seed0" / "resume.safetensors"
    deadline = time.monotonic() + 300
    while not saved.is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert saved.is_file()
    assert not (out / "metrics.json").is_file() or records(out) == []
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    resumed = records(out)[0]
    assert resumed["global_test_accuracy"] == whole["global_test_accuracy"]
    assert resumed["bytes_up"] == whole["bytes_up"]
