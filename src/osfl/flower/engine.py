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
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
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


class FlowerEngineRuntime:
    """``num_supernodes`` defaults to the job's number of clients (node ``i``
    gets ``partition-id`` ``i``); ``backend_config`` goes to Flower unchanged
    (default: one CPU per ClientApp actor, no GPU)."""

    name = "flower-engine"

    def __init__(
        self,
        builder: JobBuilder,
        spec: JobSpec,
        *,
        num_supernodes: int | None = None,
        backend_config: Mapping[str, Any] | None = None,
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
        self.verbose = verbose

    def execute(self, job: Job, *, observers: Sequence[Observer] = ()) -> RunResult:
        from flwr.simulation import run_simulation  # optional: flwr[simulation] (Ray)

        results: list[RunResult] = []

        def serve(grid: Grid, spec: JobSpec) -> None:
            runtime = FlowerGridRuntime(
                grid, round_timeout=spec.round_timeout, node_timeout=spec.node_timeout
            )
            results.append(runtime.execute(job, observers=observers))

        spec = dataclasses.replace(self.spec, method=job.method.name, seed=job.seed)
        client_app = make_client_app(self.builder, spec)
        check_shippable(client_app)
        try:
            with _quiet_start():
                run_simulation(
                    server_app=make_server_app(serve, spec),
                    client_app=client_app,
                    num_supernodes=self.num_supernodes or job.num_clients,
                    backend_config=self.backend_config,  # type: ignore[arg-type]
                    verbose_logging=self.verbose,
                )
        except NodesNotConnected as e:  # its hint is about SuperNodes a user starts
            raise EngineStartError(
                f"Flower's simulation engine: only {e.connected} of {e.count} nodes "
                f"registered within {e.timeout:.0f} s (at least {e.need} needed)"
            ) from None
        except DiscoveryError as e:  # its hint is about SuperNodes a user starts
            raise EngineStartError(
                f"Flower's simulation engine: the ClientApp of client(s) {e.missing} of "
                f"{e.num_clients} did not start: {e.reasons() or 'no actor answered'}"
            ) from None
        except RuntimeError as e:
            cause = e.__cause__
            if cause is None or not str(e).startswith(_FLOWER_ENGINE_FAILED):
                raise
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            raise EngineStartError(
                f"Flower's simulation engine stopped: {type(cause).__name__}: {first}"
            ) from e
        if not results:
            raise OsflError("the Flower simulation ended without a result (see Flower's log)")
        return results[0]
