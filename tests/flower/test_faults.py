"""Dropouts, stragglers and restarts over Flower's message flow (loopback
Grid: Flower's real apps and wire encoding in this process): a client that
fails or never connects counts as dropped and the server goes on with the
survivors — with exactly the result of the method run on the survivors —
unless fewer than ``server.min_clients`` are left; a ServerApp stopped
mid-run resumes from its run directory without asking the clients whose
uploads it already accepted, and gives the uninterrupted run's numbers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from osfl.config import load_config, to_yaml
from osfl.errors import UploadError
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.server_config import ServerConfig
from osfl.flower.client import make_client_app
from osfl.flower.grid import FlowerGridRuntime
from osfl.flower.loopback import FlowerLoopbackRuntime, LoopbackGrid, loopback_identity
from osfl.flower.spec import JobSpec
from osfl.flower_app.apps import serve_experiment
from osfl.site_assembly import job_for_spec
from support.flower_toy import toy_job
from support.tiny import TINY_FAULTS


def test_a_client_that_fails_leaves_the_survivors_result() -> None:
    """Client 1 crashes under Flower; in the simulation its upload is refused:
    both aggregate clients 0 and 2 only, to the bit."""
    flw = FlowerLoopbackRuntime().execute(toy_job(crash_client=1))
    sim = SimulationRuntime().execute(toy_job(nan_clients=(1,)))
    assert torch.equal(flw.state, sim.state)
    assert all(r.accepted == [0, 2] and 1 in r.refused for r in flw.rounds)


def test_fewer_survivors_than_min_clients_stop_the_run() -> None:
    job = toy_job(crash_client=1)
    job.run.server = ServerConfig(min_clients=3)
    with pytest.raises(
        UploadError, match=r"2 usable upload\(s\) of 3 client\(s\), fewer than server.min_clients=3"
    ):
        FlowerLoopbackRuntime().execute(job)


def test_a_site_that_never_connects_counts_as_dropped_out() -> None:
    """Two SuperNodes for three clients: after node-timeout the server goes on
    with the two (min_clients permitting); the third is refused every round."""
    job = toy_job()
    grid = LoopbackGrid(make_client_app(lambda s: job, JobSpec()), 2)
    with loopback_identity():
        res = FlowerGridRuntime(grid, node_timeout=0.2).execute(job)
    sim = SimulationRuntime().execute(toy_job(nan_clients=(2,)))
    assert torch.equal(res.state, sim.state)
    assert all(r.refused[2] == "no SuperNode connected" for r in res.rounds)
    job.run.server = ServerConfig(min_clients=3)
    with loopback_identity(), pytest.raises(Exception, match="at least 3 needed"):
        FlowerGridRuntime(grid, node_timeout=0.2).execute(job)


# --------------------------------------------------------------------------- restart


class _Counting:
    """A ClientApp that counts the train messages it answers."""

    def __init__(self) -> None:
        self.app = make_client_app(job_for_spec)
        self.trained = 0

    def __call__(self, message: Any, context: Any) -> Any:
        if message.metadata.message_type.startswith("train"):
            self.trained += 1
        return self.app(message, context)


def _serve(spec: JobSpec, app: Any) -> dict[str, Any]:
    grid = LoopbackGrid(app, 3, run_config=spec.to_run_config())
    with loopback_identity():
        _, record, _ = serve_experiment(grid, spec)
    return record


@pytest.mark.parametrize("method, rounds", [("ensemble", 1), ("fedavg", 3)])
def test_a_stopped_serverapp_resumes_with_the_same_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, rounds: int
) -> None:
    extra = [f"methods=[{method}]"] + ([f"method.fedavg.rounds={rounds}"] if rounds > 1 else [])
    text = to_yaml(load_config(None, [*TINY_FAULTS, *extra]))
    whole = _serve(JobSpec(experiment=text, out_dir=str(tmp_path / "whole")), _Counting())

    cls = type(job_for_spec(JobSpec(experiment=text)).method)
    real = cls.aggregate
    stop_at = rounds - 1  # the last round: every upload of it already accepted

    def server_dies(self: Any, state: Any, uploads: Any, round: int) -> Any:
        if round == stop_at:
            raise KeyboardInterrupt("the ServerApp was stopped")
        return real(self, state, uploads, round)

    monkeypatch.setattr(cls, "aggregate", server_dies)
    spec = JobSpec(experiment=text, out_dir=str(tmp_path / "run"))
    with pytest.raises(KeyboardInterrupt):
        _serve(spec, _Counting())
    monkeypatch.setattr(cls, "aggregate", real)
    app = _Counting()
    resumed = _serve(dataclasses.replace(spec, resume=True), app)
    assert app.trained == 0  # every upload of the stopped round was kept: nobody retrains
    assert resumed["global_test_accuracy"] == whole["global_test_accuracy"]
    assert resumed["bytes_up"] == whole["bytes_up"]
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert len(doc["records"]) == 1
    events = [
        json.loads(x)["event"] for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    ]
    assert events.count("run_start") == 2 and "run_failed" in events


@pytest.mark.slow
def test_a_supernode_killed_mid_round_leaves_the_survivors_result(tmp_path: Path) -> None:
    """Real processes: SuperNode 2 is SIGKILLed while the clients train; after
    the round timeout the server aggregates clients 0 and 1, and the result
    equals the simulation in which client 2's upload was refused."""
    import threading
    import time

    from osfl.experiment import run_experiment
    from osfl.flower_app.local import LocalFederation

    overrides = ("partition.num_clients=3", "train.epochs=40", "cache_dir=null")
    one = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = tmp_path / "run"
    spec = JobSpec(method="fedavg", overrides=overrides, out_dir=str(out), round_timeout=45.0)
    with LocalFederation(3, tmp_path / "fed", env=one) as fed:
        done: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: done.setdefault("out", fed.run(spec, timeout=600)))
        worker.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every node answered discovery: the round starts
            log = out / "run.log"
            if log.is_file() and "discovery: client(s)" in log.read_text():
                break
            time.sleep(0.2)
        fed.kill_node(2)
        worker.join(timeout=600)
    record = json.loads((out / "metrics.json").read_text())["records"][0]
    assert [r[1] for r in record["refused"]] == [2]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config(
            None, [*overrides, "methods=[fedavg]", "byzantine.clients=[2]", "byzantine.kind=nan"]
        )
        (sim,) = run_experiment(cfg)
    finally:
        torch.set_num_threads(threads)
    assert record["global_test_accuracy"] == sim["global_test_accuracy"]
    assert record["bytes_up"] == sim["bytes_up"]
