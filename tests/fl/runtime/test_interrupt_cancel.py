"""^C during a run cancels the client jobs not yet started (instead of starting
and waiting for every queued one), says so in one line, and leaves a run that
``osfl run --resume`` finishes with the numbers of a run never stopped."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from osfl.cli import main
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime import simulation
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.simulation import ClientGate, InProcessClients
from support.smoke import tiny_cli_args


@pytest.fixture
def gate_stopped(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a round's gate stops: a client that waits for it is still
    running when another fails, and its worker then asks for the next queued
    job (the race a plain ``Future.cancel`` loses)."""
    stopped = threading.Event()

    class Watched(ClientGate):
        def stop(self) -> frozenset[int]:
            started = super().stop()
            stopped.set()
            return started

    monkeypatch.setattr(simulation, "ClientGate", Watched)
    return stopped


class _Recorder(InProcessClients):
    """Client turns that record their start; client 1 fails the way a ^C
    reaching a client would, while client 0 is running."""

    def __init__(self, pool: ThreadPoolExecutor, gate_stopped: threading.Event) -> None:
        super().__init__(SimpleNamespace(method=object()), pool)  # type: ignore[arg-type]
        self.started: list[int] = []
        self.zero_running = threading.Event()
        self.gate_stopped = gate_stopped

    def turn(self, c: int, r: int, payload: bytes) -> ClientTurn:
        self.started.append(c)
        if c == 0:
            self.zero_running.set()
            assert self.gate_stopped.wait(30)
        if c == 1:
            assert self.zero_running.wait(30)
            raise KeyboardInterrupt
        return ClientTurn(upload=None, state=None)


def test_a_failed_client_job_starts_no_queued_one_and_says_so_once(
    caplog: pytest.LogCaptureFixture, gate_stopped: threading.Event
) -> None:
    pool = ThreadPoolExecutor(2)
    transport = _Recorder(pool, gate_stopped)
    with caplog.at_level(logging.WARNING, logger="osfl"), pytest.raises(KeyboardInterrupt):
        transport.exchange(4, list(range(6)), b"", ProgressTask())
    pool.shutdown(wait=True)  # what would have started has started by now
    assert sorted(transport.started) == [0, 1]
    lines = [r.getMessage() for r in caplog.records if "not yet started" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("interrupted in round 5: 4 client job(s) not yet started cancelled")


def _accuracy(out: Path) -> list[Any]:
    records = json.loads((out / "metrics.json").read_text())["records"]
    return [(r["method"], r["global_test_accuracy"], r["bytes_up"]) for r in records]


def test_ctrl_c_in_a_round_leaves_a_run_that_resumes_with_the_same_numbers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gate_stopped: threading.Event,
) -> None:
    """FedAvg, 4 clients two at a time, ^C in round 2 from client 1: the exit is
    ^C's (130), the clients queued behind it never train, the warning is one
    line, and ``--resume`` ends with the uninterrupted run's numbers."""
    args = [
        *[a for a in tiny_cli_args(tmp_path, "fedavg") if not a.startswith("partition.num")],
        "partition.num_clients=4",
        "method.fedavg.rounds=3",
        "parallel_clients=2",
    ]
    assert main(["run", *args, "--out", str(tmp_path / "whole")]) == 0

    real = InProcessClients.turn
    trained: list[tuple[int, int]] = []

    def interrupted(self: InProcessClients, c: int, r: int, payload: bytes) -> ClientTurn:
        trained.append((r, c))
        if (r, c) == (1, 0):
            assert gate_stopped.wait(30)  # running when client 1 fails
        if (r, c) == (1, 1):
            raise KeyboardInterrupt  # as if ^C reached this client
        return real(self, c, r, payload)

    monkeypatch.setattr(InProcessClients, "turn", interrupted)
    out = tmp_path / "stopped"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["run", *args, "--out", str(out)])
    assert stop.value.code == 130
    assert (1, 2) not in trained and (1, 3) not in trained
    assert not any(r == 2 for r, _ in trained)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "not yet started" in x]
    assert len(lines) == 1 and "interrupted in round 2" in lines[0], err

    monkeypatch.setattr(InProcessClients, "turn", real)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert _accuracy(out) == _accuracy(tmp_path / "whole")
