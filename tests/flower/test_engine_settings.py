"""``runtime=flower_engine`` on a Ray cluster the user already runs, and its
waits as settings (``flower_engine.*``, docs/flower.md).

The fast tests check what reaches Flower and Ray (no Ray run); the slow ones
start a Ray head on 127.0.0.1 (``ray start --head --block``, stopped by its
own process id) and run a 10-client job on it, and run the engine with a
node timeout too short for its ClientApps to answer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from osfl.assembly import build_runtime, job_from_spec
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.flower import engine
from osfl.flower.engine import (
    RAY_ADDRESS_ENV,
    EngineStartError,
    FlowerEngineRuntime,
    check_reachable,
    ray_address,
)
from osfl.flower.grid import DiscoveryError
from osfl.flower.spec import JobSpec
from support.flower_toy import toy_job


@pytest.fixture
def no_ray_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    return monkeypatch


def _runtime(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> FlowerEngineRuntime:
    """An engine runtime whether or not Ray is installed (nothing starts)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "ray" else real(n, *a)
    )
    return FlowerEngineRuntime(job_from_spec, JobSpec(), **kwargs)


# --------------------------------------------------------------------------- the cluster to join
def test_the_config_setting_else_ray_address_else_a_ray_of_its_own(no_ray_env) -> None:
    assert ray_address(None) is None
    assert ray_address(" 10.0.0.5:6379 ") == "10.0.0.5:6379"
    no_ray_env.setenv(RAY_ADDRESS_ENV, "10.0.0.7:6379")
    assert ray_address(None) == "10.0.0.7:6379"
    assert ray_address("10.0.0.7:6379") == "10.0.0.7:6379"
    with pytest.raises(ConfigError) as e:  # Ray would take the variable without a word
        ray_address("10.0.0.5:6379")
    assert str(e.value) == (
        "flower_engine.ray_address=10.0.0.5:6379 and RAY_ADDRESS=10.0.0.7:6379 name two Ray "
        "clusters (Ray would join 10.0.0.7:6379): unset one"
    )


def test_the_address_reaches_rays_init_and_nothing_else_changes(no_ray_env) -> None:
    own = _runtime(no_ray_env)
    assert own.backend() == {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    with socket.socket() as head:  # something listening, as a Ray head's GCS port is
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        joined = _runtime(no_ray_env, ray_address=address).backend()
        assert joined == {
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"address": address},
        }
        no_ray_env.setenv(RAY_ADDRESS_ENV, address)
        assert _runtime(no_ray_env).backend()["init_args"] == {"address": address}


def test_an_address_nothing_answers_at_is_one_line_not_a_run_that_never_starts() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(EngineStartError) as e:
        check_reachable(f"127.0.0.1:{port}", 5.0)
    assert str(e.value).startswith(
        f"no Ray cluster answers at 127.0.0.1:{port} (flower_engine.ray_address or RAY_ADDRESS): "
    )
    assert "ray start --head" in str(e.value)
    for bad in ("nohost", "host:port", ":6379"):
        with pytest.raises(ConfigError, match=r"give the head's host:port"):
            check_reachable(bad, 5.0)
    check_reachable("auto", 5.0)  # Ray finds a cluster on this machine itself


def test_the_config_reaches_the_runtime(no_ray_env) -> None:
    pytest.importorskip("flwr")
    cfg = load_config(
        None,
        [
            "runtime=flower_engine",
            "flower_engine.ray_address=10.0.0.5:6379",
            "flower_engine.node_timeout=900",
            "flower_engine.round_timeout=3600",
        ],
    )
    import importlib.util

    real = importlib.util.find_spec
    no_ray_env.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "ray" else real(n, *a)
    )
    runtime = build_runtime(cfg)
    assert isinstance(runtime, FlowerEngineRuntime)
    assert (runtime.address, runtime.spec.node_timeout, runtime.spec.round_timeout) == (
        "10.0.0.5:6379",
        900.0,
        3600.0,
    )


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("flower_engine.node_timeout=0", "flower_engine.node_timeout must be seconds > 0, got 0"),
        ("flower_engine.round_timeout=-5", "flower_engine.round_timeout must be seconds > 0"),
        ("flower_engine.ray_address=' '", "flower_engine.ray_address is empty"),
        ("flower_engine.node_timout=600", "did you mean 'flower_engine.node_timeout'"),
    ],
)
def test_a_bad_setting_is_one_line(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_resume_may_change_where_the_engine_runs_and_how_long_it_waits(tmp_path) -> None:
    """Another cluster or a longer wait changes no number: ``--resume`` takes it."""
    from osfl.config import to_yaml
    from osfl.runner import _with_display_of

    started = load_config(None, ["runtime=flower_engine", "flower_engine.node_timeout=120"])
    resumed = load_config(None, ["runtime=flower_engine", "flower_engine.node_timeout=900"])
    assert _with_display_of(resumed, to_yaml(started)) == to_yaml(started)
    other = load_config(None, ["runtime=flower_engine", "train.lr=0.2"])
    assert _with_display_of(other, to_yaml(started)) != to_yaml(started)


# --------------------------------------------------------------------------- discovery names its setting
def _failing(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> FlowerEngineRuntime:
    import flwr.simulation

    runtime = _runtime(monkeypatch)
    monkeypatch.setattr(engine, "check_shippable", lambda app: 0)

    def run_simulation(**_: Any) -> None:
        raise error

    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)
    return runtime


def test_clientapps_that_did_not_answer_in_time_name_the_setting_to_raise(monkeypatch) -> None:
    pytest.importorskip("flwr")
    silent = DiscoveryError([7, 8, 9], 10, [], [])
    with pytest.raises(EngineStartError) as e:
        _failing(monkeypatch, silent).execute(toy_job())
    assert str(e.value) == (
        "Flower's simulation engine: the ClientApp of client(s) [7, 8, 9] of 10 did not answer "
        "within 120 s; each builds its job first: raise flower_engine.node_timeout (now 120 s; "
        "e.g. flower_engine.node_timeout=600) for many clients or a loaded machine"
    )


def test_a_ray_that_cannot_be_joined_names_the_address_setting(monkeypatch) -> None:
    pytest.importorskip("flwr")
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
        try:
            try:
                raise ConnectionError("could not reach the GCS\n(more)")
            except ConnectionError as cause:
                raise RuntimeError("An error was encountered. Ending simulation.") from cause
        except RuntimeError as wrapped:
            runtime = _failing(monkeypatch, wrapped)
        runtime.address = address
        with pytest.raises(EngineStartError) as e:
            runtime.execute(toy_job())
    assert str(e.value) == (
        f"Flower's simulation engine stopped (joining the Ray cluster at {address}: "
        "flower_engine.ray_address or RAY_ADDRESS): ConnectionError: could not reach the GCS"
    )


def test_a_client_discovery_left_out_stops_the_engine_instead_of_dropping_out() -> None:
    """On the engine every node is an actor of this run: a missing one is a
    timeout to raise, never a dropout that changes the numbers."""
    pytest.importorskip("flwr")
    from osfl.flower.client import make_client_app
    from osfl.flower.grid import FlowerGridRuntime
    from osfl.flower.loopback import LoopbackGrid, loopback_identity

    job = toy_job()
    grid = LoopbackGrid(make_client_app(lambda s: job, JobSpec()), 2)  # client 2 has no node
    with loopback_identity(), pytest.raises(DiscoveryError) as e:
        FlowerGridRuntime(grid, node_timeout=0.2, every_node=True).execute(job)
    assert e.value.missing == [2]
    with loopback_identity():  # a deployment goes on without it: a dropout
        result = FlowerGridRuntime(grid, node_timeout=0.2).execute(job)
    assert all(r.refused[2] == "no SuperNode connected" for r in result.rounds)


# --------------------------------------------------------------------------- a real Ray (slow)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, deadline: float, head: subprocess.Popen[bytes]) -> None:
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise AssertionError(f"ray start exited with {head.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(1.0)
    raise AssertionError(f"no Ray head on port {port} in time")


@pytest.mark.slow
def test_a_ten_client_job_on_a_running_ray_cluster_gives_the_in_process_numbers(
    tmp_path: Path,
) -> None:
    """``ray start --head`` on 127.0.0.1 (two CPUs), then ``osfl run ...
    runtime=flower_engine flower_engine.ray_address=127.0.0.1:PORT`` (10
    clients, 3 rounds): its driver is one of that cluster's (the cluster's own
    log holds this process's driver log), and its numbers are the in-process
    runtime's at one torch thread per client."""
    pytest.importorskip("ray")
    port = _free_port()
    temp = Path(f"/tmp/osfl-ray-{os.getpid()}-{port}")  # short: Ray's socket paths are bounded
    env = {k: v for k, v in os.environ.items() if k != RAY_ADDRESS_ENV}
    ray = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [
            str(ray) if ray.exists() else "ray",
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            f"--temp-dir={temp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, time.monotonic() + 180, head)
        args = [
            "methods=[fedavg]",
            "method.fedavg.rounds=3",
            "partition.num_clients=10",
            "train.epochs=2",
            f"cache_dir={tmp_path / 'cache'}",
            "--no-progress",
        ]
        engine_args = ["runtime=flower_engine", f"flower_engine.ray_address=127.0.0.1:{port}"]
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "osfl",
                "run",
                *args,
                *engine_args,
                "--out",
                str(tmp_path / "e"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, err = run.communicate(timeout=900)
        assert run.returncode == 0, err[-3000:]
        drivers = list(temp.glob("session_*/logs/python-core-driver-*.log"))
        assert any(p.name.endswith(f"_{run.pid}.log") for p in drivers), (drivers, run.pid)
    finally:
        head.terminate()  # `ray start --block` stops the processes it started
        head.wait(timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
    from osfl.cli import main

    assert main(["run", *args, "threads_per_client=1", "--out", str(tmp_path / "s")]) == 0
    eng, sim = (
        json.loads((tmp_path / d / "metrics.json").read_text())["records"][0] for d in ("e", "s")
    )
    assert eng["runtime"] == "flower_engine"
    for key in ("global_test_accuracy", "per_class_accuracy", "bytes_up", "bytes_down"):
        assert eng[key] == sim[key], key


@pytest.mark.slow
def test_a_node_timeout_too_short_for_the_clientapps_names_the_setting(tmp_path: Path) -> None:
    """The failure the setting exists for, made on purpose: ClientApps that
    need longer than ``flower_engine.node_timeout`` to build their job stop
    the run at discovery with one line naming it, not a run with dropouts."""
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != RAY_ADDRESS_ENV}
    argv = [
        "methods=[fedavg]",
        "partition.num_clients=10",
        "train.epochs=1",
        "flower_engine.node_timeout=0.01",
        "runtime=flower_engine",
        f"cache_dir={tmp_path / 'cache'}",
        "--no-progress",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "osfl", "run", *argv, "--out", str(tmp_path / "r")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("osfl: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "raise flower_engine.node_timeout (now 0 s" in errors[0]
