"""Flower's simulation engine ships the ClientApp to its Ray actors with
cloudpickle, with every message: closures and the globals they use travel by
value. These fast tests pickle osfl's ClientApps the same way (cloudpickle is
in the dev extra; Ray need not be installed), so a handler that captures a lock
fails here and not only in the slow engine test; a failed engine start is one
line that blames no SuperNode."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import cloudpickle
import pytest

from osfl.assembly import job_from_spec
from osfl.errors import ConfigError
from osfl.fl.runtime.base import Job
from osfl.flower import engine
from osfl.flower.client import make_client_app
from osfl.flower.engine import EngineStartError, FlowerEngineRuntime, check_shippable
from osfl.flower.grid import DiscoveryError, NodesNotConnected, discover_clients
from osfl.flower.loopback import LoopbackGrid, loopback_identity
from osfl.flower.spec import JOBS, JobCache, JobSpec, job_digest
from osfl.flower_app.apps import client_app as deployed_client_app
from support.flower_toy import toy_job

#: The specs ``counting_builder`` was asked to build, in order.
BUILT: list[JobSpec] = []


def counting_builder(spec: JobSpec) -> Job:
    """A module-level builder (pickled by reference, as osfl's are)."""
    BUILT.append(spec)
    return toy_job(spec)


def test_the_client_apps_osfl_ships_pickle_as_ray_pickles_them() -> None:
    """The deployed app (with SecAgg+'s handler) and the engine's own."""
    engine_app = make_client_app(job_from_spec, JobSpec(experiment="name: x"))
    for app in (deployed_client_app, engine_app):
        assert check_shippable(app, dumps=cloudpickle.dumps) > 0
        assert isinstance(pickle.loads(cloudpickle.dumps(app)), type(app))


def test_the_process_job_cache_unpickles_as_the_receiving_process_own() -> None:
    assert pickle.loads(cloudpickle.dumps(JOBS)) is JOBS
    other = JobCache()
    copy = pickle.loads(cloudpickle.dumps(other))
    assert isinstance(copy, JobCache) and copy is not other and copy is not JOBS


def test_every_unpickled_copy_of_the_app_reuses_the_job_built_once() -> None:
    """Ray unpickles a new copy of the ClientApp for every message; all of
    them must hit the one job this process (actor) built, not rebuild it."""
    BUILT.clear()
    job = toy_job()
    app = make_client_app(counting_builder)
    for _ in range(2):
        copy = pickle.loads(cloudpickle.dumps(app))
        with loopback_identity():
            nodes = discover_clients(LoopbackGrid(copy, 3), job, job_digest(job), timeout=5)
        assert sorted(nodes) == [0, 1, 2]
    assert len(BUILT) == 1


def test_a_captured_lock_is_one_line_before_any_actor_starts() -> None:
    lock = threading.Lock()

    def holds_a_lock(spec: JobSpec) -> Job:
        with lock:
            return toy_job(spec)

    with pytest.raises(EngineStartError) as info:
        check_shippable(make_client_app(holds_a_lock), dumps=cloudpickle.dumps)
    line = str(info.value)
    assert "cannot pickle '_thread.lock' object" in line
    assert "\n" not in line and "SuperNode" not in line and "supernode" not in line


def _engine(monkeypatch: pytest.MonkeyPatch, fails_with: BaseException) -> FlowerEngineRuntime:
    """An engine runtime whose ``run_simulation`` fails as given (no Ray run)."""
    import importlib.util

    import flwr.simulation

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "ray" else real(n, *a)
    )
    monkeypatch.setattr(engine, "check_shippable", lambda app: 0)

    def run_simulation(**_: Any) -> None:
        raise fails_with

    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)
    return FlowerEngineRuntime(counting_builder, JobSpec())


def test_actors_that_cannot_build_their_job_are_one_line_naming_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = "data 'imagefolder:/srv/x' holds no images"
    refused = DiscoveryError([0, 1, 2, 3], 4, [f"node {n}: {reason}" for n in (11, 12, 13, 14)], [])
    with pytest.raises(EngineStartError) as info:
        _engine(monkeypatch, refused).execute(toy_job())
    line = str(info.value)
    assert line.startswith("Flower's simulation engine: the ClientApp of client(s) [0, 1, 2, 3]")
    assert line.count(reason) == 1 and "4 nodes" in line
    assert "\n" not in line and "SuperNode" not in line and "supernode" not in line


def test_nodes_that_never_registered_are_one_line_without_the_supernode_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = NodesNotConnected(connected=1, count=3, need=2, timeout=120.0)
    assert "start one flower-supernode" in str(missing)  # right for a deployment
    with pytest.raises(EngineStartError) as info:
        _engine(monkeypatch, missing).execute(toy_job())
    line = str(info.value)
    assert line == (
        "Flower's simulation engine: only 1 of 3 nodes registered within 120 s (at least 2 "
        "needed): raise flower_engine.node_timeout (now 120 s; e.g. "
        "flower_engine.node_timeout=600) for many clients or a loaded machine"
    )


def test_a_failed_engine_is_one_line_with_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    try:  # what flwr.simulation.run_simulation raises when its engine fails
        try:
            raise OSError("ray could not start: no space left on device\n(more)")
        except OSError as cause:
            raise RuntimeError("An error was encountered. Ending simulation.") from cause
    except RuntimeError as e:
        failure = e
    with pytest.raises(EngineStartError, match=r"^Flower's simulation engine stopped: OSError: "):
        _engine(monkeypatch, failure).execute(toy_job())
    other = ConfigError("the ServerApp's own error")  # passes through unchanged
    with pytest.raises(ConfigError, match=r"^the ServerApp's own error$"):
        _engine(monkeypatch, other).execute(toy_job())


def test_an_engine_start_leaves_out_flowers_run_simulation_deprecation_only() -> None:
    """The notice tells a ``run_simulation`` caller to use ``flwr run``; an
    ``osfl run`` user calls neither. Other Flower lines pass."""
    import logging

    def record(msg: str, *args: Any) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, msg, args, None)

    quiet = engine._NoRunSimulationDeprecation()
    deprecation = "The `run_simulation` function is deprecated and will be removed"
    assert not quiet.filter(record("DEPRECATED FEATURE: %s", deprecation))
    assert quiet.filter(record("An exception was raised when processing a message"))
