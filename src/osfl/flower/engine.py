"""Flower's own simulation engine as a runtime (``flwr.simulation.run_simulation``;
Flower 1.41's only backend is Ray: ``pip install "flwr[simulation]"``).

The ServerApp runs in a thread of this process with the job it was given (so
the result comes back); every ClientApp is a Ray actor that builds its own job
from the :class:`~osfl.flower.spec.JobSpec` with ``builder`` — as a
SuperNode does — and must arrive at the same job digest. The spec's method
and seed are the job's.

Ray ships the ClientApp to its actors with cloudpickle, with every message:
its handlers' closures and the globals they use travel by value (the
process-wide job cache pickles by reference, :class:`~osfl.flower.spec.JobCache`).
:func:`check_shippable` pickles it first, so that an object that cannot travel
(a lock, an open file) is one line here rather than hundreds of Ray's; a
ClientApp that fails to start is one line too (:class:`EngineStartError`).

Where Ray runs: Flower's Ray backend calls ``ray.init(**init_args)``, so
``ray_address`` (config ``flower_engine.ray_address``, else Ray's own
``RAY_ADDRESS``) makes the engine join a cluster the user already runs
(``ray start --head`` on one machine, ``ray start --address`` on the others)
instead of starting a Ray of its own. How long the server waits is the spec's
``node_timeout`` (every node registers and answers discovery: each ClientApp
builds its job then) and ``round_timeout``; the config's
``flower_engine.node_timeout`` and ``.round_timeout``, which the errors name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from osfl.errors import ConfigError, OsflError
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import Job, RunResult
from osfl.flower.client import make_client_app
from osfl.flower.grid import (
    DiscoveryError,
    FlowerGridRuntime,
    NodesNotConnected,
    make_server_app,
)
from osfl.flower.spec import JobBuilder, JobSpec

#: What ``flwr.simulation.run_simulation`` raises (chained to the cause) when
#: its engine fails; the ServerApp's own exceptions come through unchanged.
_FLOWER_ENGINE_FAILED = "An error was encountered"
#: Ray's own variable for the cluster a driver joins (Ray prefers it to ``ray.init(address=)``).
RAY_ADDRESS_ENV = "RAY_ADDRESS"

log = logging.getLogger(__name__)


class EngineStartError(OsflError):
    """Flower's simulation engine did not get the run going: the ClientApp
    could not be shipped to the actors, or the actors could not build their
    job. One line that says what failed; no SuperNode is involved (the
    engine's nodes are Ray actors osfl starts itself)."""


class _NoRunSimulationDeprecation(logging.Filter):
    """Flower 1.41 deprecates ``run_simulation`` for ``flwr run``: advice to
    someone calling it, not to an ``osfl run`` user, who calls neither (the
    ``flwr run`` path of osfl is docs/flower.md's deployment)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()


@contextlib.contextmanager
def _quiet_start() -> Iterator[None]:
    """Leave out the two notices every engine start printed that say nothing
    about this run: Flower's deprecation of ``run_simulation`` and Ray's
    ``FutureWarning`` about accelerator variables for actors without a GPU.
    Errors and Flower's own INFO lines pass as before."""
    flwr_logger = logging.getLogger("flwr")
    notice = _NoRunSimulationDeprecation()
    flwr_logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"Tip: In future versions of Ray", category=FutureWarning
            )
            yield
    finally:
        flwr_logger.removeFilter(notice)


def check_shippable(app: ClientApp, dumps: Callable[[Any], bytes] | None = None) -> int:
    """Pickle ``app`` as Ray does before any actor starts; returns its size in
    bytes. ``dumps`` defaults to Ray's own cloudpickle."""
    if dumps is None:
        # optional: ray (flwr[simulation]); cloudpickle is what Ray ships every actor call with
        from ray import cloudpickle

        dumps = cloudpickle.dumps
    try:
        return len(dumps(app))
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EngineStartError(
            f"Flower's simulation engine cannot send the ClientApp to its Ray actors: "
            f"{type(e).__name__}: {why} (a handler or the job builder holds an object that "
            "cannot be pickled)"
        ) from None


def ray_address(setting: str | None) -> str | None:
    """The Ray cluster the engine joins: ``setting`` (config
    ``flower_engine.ray_address``), else ``RAY_ADDRESS``; ``None``: a Ray of
    its own. Both set and different is refused, since Ray would take
    ``RAY_ADDRESS`` over the config without a word."""
    env = os.environ.get(RAY_ADDRESS_ENV, "").strip() or None
    if setting is not None and env is not None and setting.strip() != env:
        raise ConfigError(
            f"flower_engine.ray_address={setting} and {RAY_ADDRESS_ENV}={env} name two Ray "
            f"clusters (Ray would join {env}): unset one"
        )
    return setting.strip() if setting is not None else env


def check_reachable(address: str, timeout: float) -> None:
    """Refuse a cluster address nothing answers at, in one line: Ray itself
    retries a missing head for ever, a run that never starts. ``auto`` (Ray
    finds a cluster on this machine) is left to Ray."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(
            f"flower_engine.ray_address={address}: give the head's host:port "
            "(e.g. 127.0.0.1:6379), ray://host:port or auto"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise EngineStartError(
            f"no Ray cluster answers at {address} (flower_engine.ray_address or "
            f"{RAY_ADDRESS_ENV}): {e.strerror or type(e).__name__}; start it with "
            "`ray start --head --port=<port>` or fix the address"
        ) from None


def _timeout_hint(timeout: float) -> str:
    return (
        f"raise flower_engine.node_timeout (now {timeout:.0f} s; e.g. "
        f"flower_engine.node_timeout={max(600, int(timeout) * 4)}) for many clients or a "
        "loaded machine"
    )


class FlowerEngineRuntime:
    """``num_supernodes`` defaults to the job's number of clients (node ``i``
    gets ``partition-id`` ``i``); ``backend_config`` goes to Flower unchanged
    (default: one CPU per ClientApp actor, no GPU); ``ray_address`` joins a
    running Ray cluster (:func:`ray_address`: else ``RAY_ADDRESS``, else a
    Ray of its own). The spec's ``node_timeout`` and ``round_timeout`` are
    the server's waits."""

    name = "flower-engine"

    def __init__(
        self,
        builder: JobBuilder,
        spec: JobSpec,
        *,
        num_supernodes: int | None = None,
        backend_config: Mapping[str, Any] | None = None,
        ray_address: str | None = None,
        verbose: bool = False,
    ):
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "Flower's simulation engine needs Ray: pip install 'flwr[simulation]' "
                "(or use osfl's runtime=simulation, or runtime=flower in one process)"
            )
        self.builder, self.spec = builder, spec
        self.num_supernodes = num_supernodes
        self.backend_config = dict(
            backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
        )
        self.address = ray_address
        self.verbose = verbose

    def backend(self) -> dict[str, Any]:
        """Flower's backend config, with the cluster to join as Ray's ``address``."""
        address = ray_address(self.address)
        config = dict(self.backend_config)
        if address is not None:
            check_reachable(address, min(self.spec.node_timeout, 30.0))
            config["init_args"] = {**config.get("init_args", {}), "address": address}
            log.info("Flower's simulation engine joins the Ray cluster at %s", address)
        return config

    def execute(self, job: Job, *, observers: Sequence[Observer] = ()) -> RunResult:
        from flwr.simulation import run_simulation  # optional: flwr[simulation] (Ray)

        results: list[RunResult] = []

        def serve(grid: Grid, spec: JobSpec) -> None:
            runtime = FlowerGridRuntime(
                grid,
                round_timeout=spec.round_timeout,
                node_timeout=spec.node_timeout,
                every_node=True,  # every node is an actor of this run: a missing one timed out
            )
            results.append(runtime.execute(job, observers=observers))

        spec = dataclasses.replace(self.spec, method=job.method.name, seed=job.seed)
        client_app = make_client_app(self.builder, spec)
        check_shippable(client_app)
        backend_config = self.backend()
        try:
            with _quiet_start():
                run_simulation(
                    server_app=make_server_app(serve, spec),
                    client_app=client_app,
                    num_supernodes=self.num_supernodes or job.num_clients,
                    backend_config=backend_config,  # type: ignore[arg-type]
                    verbose_logging=self.verbose,
                )
        except NodesNotConnected as e:  # its hint is about SuperNodes a user starts
            raise EngineStartError(
                f"Flower's simulation engine: only {e.connected} of {e.count} nodes "
                f"registered within {e.timeout:.0f} s (at least {e.need} needed): "
                f"{_timeout_hint(e.timeout)}"
            ) from None
        except DiscoveryError as e:  # its hint is about SuperNodes a user starts
            raise discovery_failed(e, spec.node_timeout) from None
        except RuntimeError as e:
            failure = engine_failed(e, backend_config)
            if failure is e:  # not the engine's: keep its traceback
                raise
            raise failure from e
        if not results:
            raise OsflError("the Flower simulation ended without a result (see Flower's log)")
        return results[0]


def discovery_failed(e: DiscoveryError, timeout: float) -> EngineStartError:
    """Discovery's error in the engine's words: a ClientApp that refused its
    job says why; one that did not answer missed ``node_timeout``, the
    setting to raise."""
    if e.problems:
        return EngineStartError(
            f"Flower's simulation engine: the ClientApp of client(s) {e.missing} of "
            f"{e.num_clients} did not start: {e.reasons()}"
        )
    gone = f" ({e.reasons()})" if e.gone else ""
    return EngineStartError(
        f"Flower's simulation engine: the ClientApp of client(s) {e.missing} of "
        f"{e.num_clients} did not answer within {timeout:.0f} s{gone}; each builds its "
        f"job first: {_timeout_hint(timeout)}"
    )


def engine_failed(e: RuntimeError, backend_config: Mapping[str, Any]) -> Exception:
    """Flower's wrapped engine failure as one line (a cluster it could not
    join named with its setting); any other ``RuntimeError`` unchanged."""
    cause = e.__cause__
    if cause is None or not str(e).startswith(_FLOWER_ENGINE_FAILED):
        return e
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    address = backend_config.get("init_args", {}).get("address")
    where = (
        f" (joining the Ray cluster at {address}: flower_engine.ray_address or {RAY_ADDRESS_ENV})"
        if address is not None
        else ""
    )
    return EngineStartError(
        f"Flower's simulation engine stopped{where}: {type(cause).__name__}: {first}"
    )
