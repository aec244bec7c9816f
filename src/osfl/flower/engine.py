"""Flower's own simulation engine as a runtime (``flwr.simulation.run_simulation``;
Flower 1.41's only backend is Ray: ``pip install "flwr[simulation]"``).

The ServerApp runs in a thread of this process with the job it was given (so
the result comes back); every ClientApp is a Ray actor that builds its own job
from the :class:`~osfl.flower.spec.JobSpec` with ``builder`` — as a
SuperNode does — and must arrive at the same job digest. The spec's method
and seed are the job's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.serverapp import Grid

from osfl.errors import ConfigError, OsflError
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import Job, RunResult
from osfl.flower.client import make_client_app
from osfl.flower.grid import FlowerGridRuntime, make_server_app
from osfl.flower.spec import JobBuilder, JobSpec


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
        from flwr.simulation import run_simulation

        results: list[RunResult] = []

        def serve(grid: Grid, spec: JobSpec) -> None:
            runtime = FlowerGridRuntime(
                grid, round_timeout=spec.round_timeout, node_timeout=spec.node_timeout
            )
            results.append(runtime.execute(job, observers=observers))

        spec = dataclasses.replace(self.spec, method=job.method.name, seed=job.seed)
        run_simulation(
            server_app=make_server_app(serve, spec),
            client_app=make_client_app(self.builder, spec),
            num_supernodes=self.num_supernodes or job.num_clients,
            backend_config=self.backend_config,  # type: ignore[arg-type]
            verbose_logging=self.verbose,
        )
        if not results:
            raise OsflError("the Flower simulation ended without a result (see Flower's log)")
        return results[0]
