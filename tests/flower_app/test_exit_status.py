"""A Flower run's outcome as an exit status and one log line (Flower 1.41's
``flwr run`` exits 0 whatever the ServerApp did, and its log carries a
ServerApp exception's whole traceback): ``osfl flower run`` reads the run's
final status from the SuperLink, ``osfl flower status`` reads a run directory,
and an osfl error in a ServerApp reaches Flower's log as one line."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.errors import ConfigError
from osfl.flower.grid import OneLineOsflErrors
from osfl.flower.spec import JobSpec
from osfl.flower_app.runs import RunFailed, check_status, started_run_id
from support.tiny import TINY_FLOWER_STATUS


def cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def _formatted(error: Exception) -> str:
    try:
        raise error
    except Exception as e:  # the way Flower's run_serverapp logs it
        record = logging.LogRecord(
            "flwr", logging.ERROR, __file__, 1, "%s raised an exception", ("ServerApp",), None
        )
        record.exc_info = (type(e), e, e.__traceback__)
    OneLineOsflErrors().filter(record)
    return logging.Formatter().format(record)


def test_an_osfl_error_in_the_serverapp_is_one_log_line() -> None:
    line = _formatted(ConfigError("run directory runs/x already holds a metrics.json"))
    assert line == "osfl: error: run directory runs/x already holds a metrics.json"
    bug = _formatted(KeyError("a bug"))  # anything else keeps its traceback
    assert "Traceback" in bug and "raised an exception" in bug


def test_the_run_id_and_status_flwr_prints_are_read() -> None:
    assert started_run_id("\x1b[32mSuccessfully started run 7265\x1b[0m\nlogs...") == 7265
    assert started_run_id("Failed to start run") is None
    check_status({"status": "finished:completed"}, 1)
    with pytest.raises(RunFailed, match=r"run 3 ended finished:failed: ServerApp failed"):
        check_status(
            {"status": "finished:failed", "status-details": "ServerApp failed with exception: x"},
            3,
        )
    assert RunFailed("x").exit_status == 1 and ConfigError("x").exit_status == 2


def test_status_of_a_run_directory(tmp_path: Path) -> None:
    done = tmp_path / "done"
    code, _, err = cli(
        ["run", *TINY_FLOWER_STATUS, "methods=[fedavg]", "--out", str(done), "--no-progress"]
    )
    assert code == 0, err
    assert cli(["flower", "status", str(done)])[0] == 0
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "events.jsonl").write_text(
        '{"event": "run_start"}\n{"event": "run_failed", "error": "UploadError", '
        '"reason": "round 0: every upload was refused"}\n'
    )
    code, _, err = cli(["flower", "status", str(failed)])
    assert code == 1 and "every upload was refused" in err
    (failed / "events.jsonl").write_text('{"event": "run_start"}\n')
    code, _, err = cli(["flower", "status", str(failed)])
    assert code == 1 and "did not finish" in err
    code, _, err = cli(["flower", "status", str(tmp_path)])
    assert code == 2 and err.count("osfl: error:") == 1


def test_status_judges_the_last_attempt_of_a_resumed_run(tmp_path: Path) -> None:
    """Issue #43: a first attempt that failed, then ``osfl run --resume`` to
    the end (it appends to the same events.jsonl): finished, exit 0; the
    reverse order (a finished attempt, then one that failed) is a failure."""
    out = tmp_path / "run"
    args = ["run", *TINY_FLOWER_STATUS, "methods=[fedavg]", "--out", str(out), "--no-progress"]
    assert cli(args)[0] == 0
    log = out / "events.jsonl"
    finished = log.read_text()
    failed = '{"event": "run_start"}\n{"event": "run_failed", "error": "KeyboardInterrupt", "reason": ""}\n'
    log.write_text(failed + finished)  # an interrupted attempt, then a resumed one
    code, stdout, err = cli(["flower", "status", str(out)])
    assert code == 0 and "finished (1 record)" in stdout, err
    log.write_text(finished + failed)
    code, _, err = cli(["flower", "status", str(out)])
    assert code == 1 and "KeyboardInterrupt" in err


def test_status_needs_a_record_and_a_readable_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text('{"event": "run_start"}\n{"event": "run_end"}\n')
    code, _, err = cli(["flower", "status", str(run)])
    assert code == 1 and "left no record" in err
    (run / "events.jsonl").write_text('{"event": "run_end"}\n')  # no attempt started
    code, _, err = cli(["flower", "status", str(run)])
    assert code == 2 and "no run_start" in err and err.count("\n") == 1
    (run / "events.jsonl").write_bytes(b'{"event": "run_start"}\n\xff\xfe\n')
    code, _, err = cli(["flower", "status", str(run)])
    assert code == 2 and "not UTF-8" in err and "Traceback" not in err


def test_a_resumed_osfl_run_after_an_interrupt_is_finished(tmp_path: Path, monkeypatch) -> None:
    """The issue's sequence end to end: an interrupt (events: run_start,
    run_failed KeyboardInterrupt), ``osfl run --resume DIR`` to the end, then
    ``osfl flower status DIR``: finished, exit 0."""
    import osfl.runner

    out = tmp_path / "run"
    args = [
        "run",
        *TINY_FLOWER_STATUS,
        "methods=[local,fedavg]",
        "--out",
        str(out),
        "--no-progress",
    ]

    def interrupted(*a, **k):  # the first attempt is stopped as by Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(osfl.runner, "execute_plan", interrupted)
    assert cli(args)[0] == 130
    monkeypatch.undo()
    assert cli(["flower", "status", str(out)])[0] == 1
    code, _, err = cli(["run", "--resume", str(out), "--no-progress"])
    assert code == 0, err
    code, stdout, err = cli(["flower", "status", str(out)])
    assert code == 0 and "finished (2 records)" in stdout, err


@pytest.mark.slow
def test_a_failed_flower_run_exits_1_with_one_error_line(tmp_path: Path) -> None:
    """A real SuperLink and two SuperNodes; the ServerApp refuses an out-dir
    that already holds a finished run: ``osfl flower run`` exits 1 and the
    streamed log holds the osfl line, no traceback."""
    from osfl.flower_app.local import LocalFederation

    out = tmp_path / "taken"
    out.mkdir()
    (out / "metrics.json").write_text('{"records": []}')
    spec = JobSpec(method="fedavg", overrides=TINY_FLOWER_STATUS, out_dir=str(out))
    with LocalFederation(2, tmp_path / "fed", env={"OMP_NUM_THREADS": "1"}) as fed:
        cmd = [sys.executable, "-c", "import sys; from osfl.cli import main; sys.exit(main())"]
        done = subprocess.run(
            [*cmd, "flower", "run", *fed.run_args(spec)],
            cwd=fed.workdir,
            env=fed.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "already holds a metrics.json" in log
    assert "Traceback" not in log, log
