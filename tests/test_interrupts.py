"""Ctrl-C (:mod:`osfl.interrupts`): the first stops the run after the clients
already training, a second stops the process at once with status 130 (it
aborted with ``terminate called without an active exception``, exit 134,
before), and neither cuts a file: every file of the run directory parses and
``--resume`` takes it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from osfl import interrupts
from osfl.config import load_config
from osfl.rundir import resume_problem


@pytest.fixture
def policy():
    """The policy installed, as ``osfl`` installs it for a command."""
    with interrupts.sigint_policy():
        yield


def test_the_first_ctrl_c_is_a_keyboard_interrupt(policy) -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupts._handler(signal.SIGINT, None)


def test_a_first_ctrl_c_during_a_write_waits_for_its_end(policy, tmp_path) -> None:
    path = tmp_path / "f.txt"
    with pytest.raises(KeyboardInterrupt), interrupts.atomic_section():
        interrupts._handler(signal.SIGINT, None)  # arrives mid-write: deferred
        path.write_text("whole")
    assert path.read_text() == "whole"


def test_a_ctrl_c_outside_osfl_commands_is_pythons_own() -> None:
    assert signal.getsignal(signal.SIGINT) is not interrupts._handler
    with interrupts.sigint_policy():
        assert signal.getsignal(signal.SIGINT) is interrupts._handler
    assert signal.getsignal(signal.SIGINT) is not interrupts._handler


SECOND_DURING_A_WRITE = """
import os, signal, sys, threading, time
from pathlib import Path
from osfl import interrupts

out = Path(sys.argv[1])
started = threading.Event()

def writer():
    with interrupts.atomic_section():
        started.set()
        with open(out, "w") as f:
            for i in range(20):
                f.write(f"line {i}\\n")
                f.flush()
                time.sleep(0.05)

with interrupts.sigint_policy():
    interrupts.on_exit_at_once(lambda: print("said why", flush=True))
    t = threading.Thread(target=writer)
    t.start()
    started.wait()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    os.kill(os.getpid(), signal.SIGINT)  # the write is still going: exit after it
    while True:
        time.sleep(1)
"""


def test_a_second_ctrl_c_exits_with_130_after_the_write_in_progress(tmp_path) -> None:
    out = tmp_path / "written.txt"
    done = subprocess.run(
        [sys.executable, "-c", SECOND_DURING_A_WRITE, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert out.read_text().splitlines() == [f"line {i}" for i in range(20)]  # not cut
    assert done.stdout == "said why\n"
    assert interrupts.FIRST in done.stderr and interrupts.SECOND in done.stderr


# --------------------------------------------------------------------------- a real run
def _wait_for_event(events: Path, kind: str, proc: subprocess.Popen[str]) -> None:
    while proc.poll() is None:
        if events.is_file() and f'"event": "{kind}"' in events.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"osfl run ended before {kind}: {proc.communicate()[1][-2000:]}")


def test_two_ctrl_cs_stop_a_run_at_once_with_130_and_every_file_whole(tmp_path) -> None:
    """``osfl run`` with clients training in two threads (far longer than this
    test waits): the first SIGINT stops the round, the second 1 s later ends
    the process while those clients still train (no client finished, so it
    did not wait for them), with 130, no C++ abort, and a run directory
    whose every file parses and that ``--resume`` takes."""
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "osfl",
        "run",
        "methods=[fedavg]",
        "data.image_size=8",
        "partition.num_clients=4",
        "train.epochs=400",
        "parallel_clients=2",
        f"cache_dir={tmp_path / 'cache'}",
        "--no-progress",
        "-v",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_event(out / "events.jsonl", "method_start", proc)
        time.sleep(1.0)  # the two clients' threads are training
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
    assert err.rstrip().endswith(interrupts.SECOND), err[-3000:]
    log = (out / "run.log").read_text()
    assert " steps, loss " not in log  # no client finished: it stopped at once

    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp")], names
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["train"]["epochs"] == 400
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[-1] == {**events[-1], "event": "run_failed", "reason": "interrupted twice"}
    for png in out.glob("*.png"):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG") and data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
    if (out / "metrics.json").exists():
        json.loads((out / "metrics.json").read_text())
    assert resume_problem(out) is None
    assert load_config(out / "config.yaml", []).train.epochs == 400
