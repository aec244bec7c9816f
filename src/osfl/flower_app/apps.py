"""The ServerApp and ClientApp a Flower deployment of osfl loads
(``osfl.flower_app.apps:server_app`` / ``:client_app``).

Both sides start from the same :class:`~osfl.fl.runtime.flower_spec.JobSpec`
(Flower's run config) and build with :mod:`osfl.assembly` — the functions
``osfl run`` uses — so a Flower run and a simulation run of one config,
method and seed hold equal data, federation, model, recipe and method.

- Clients (SuperNodes, Flower-simulation actors): :func:`osfl.assembly.job_from_spec`.
- Server: :func:`serve_experiment` runs the job on a
  :class:`~osfl.fl.runtime.flower_server.FlowerGridRuntime` holding the
  ServerApp's Grid and writes a run directory like ``osfl run``, whose record
  is built by the same code as a simulation record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from osfl import assembly, report
from osfl.config import to_dict, to_yaml
from osfl.errors import ConfigError
from osfl.experiment import run_method
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import RunResult
from osfl.fl.runtime.flower_client import make_client_app
from osfl.fl.runtime.flower_server import FlowerGridRuntime, make_server_app
from osfl.fl.runtime.flower_spec import JobSpec
from osfl.rundir import RunDir

log = logging.getLogger(__name__)


class _ResultCapture(Observer):
    """Keeps the runtime's result (``on_run_end``) for the ServerApp's caller."""

    def __init__(self) -> None:
        self.result: RunResult | None = None

    def on_run_end(self, result: Any) -> None:
        self.result = result


def serve_experiment(
    grid: Grid, spec: JobSpec, *, observers: Sequence[Observer] = ()
) -> tuple[RunResult | None, dict[str, Any], Path]:
    """The ServerApp side of an experiment job: run it over ``grid`` and write
    a run directory like ``osfl run`` does (``config.yaml``, ``metrics.json``,
    ``events.jsonl``, ``summary.md``, ``run.log``).

    Returns ``(RunResult, metrics record, run directory)``. The run directory
    is ``spec.out_dir``, or ``runs/<stamp>-<name>-flower`` under the
    ServerApp's working directory (the SuperLink's).
    """
    cfg, name, seed = assembly.load_experiment(spec)
    cfg = dataclasses.replace(cfg, runtime="flower", methods=[name], seeds=[seed])
    out = Path(spec.out_dir) if spec.out_dir else RunDir.default_path(f"{cfg.name}-flower")
    if (out / "metrics.json").exists():  # refuse before training, not after
        raise ConfigError(
            f"run directory {out} already holds a metrics.json: give this run another "
            "out-dir (flwr run ... --run-config 'out-dir=\"<new dir>\"'), or leave out-dir "
            "empty for a fresh runs/<stamp>-<name>-flower"
        )
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), seed)
    job = assembly.build_job(cfg, name, ctx)
    job.method.check()
    runtime = FlowerGridRuntime(
        grid, round_timeout=spec.round_timeout, node_timeout=spec.node_timeout
    )
    with RunDir(out) as rd:
        rd.write_text(
            "config.yaml", f"# osfl Flower run: method {name}, seed {seed}\n" + to_yaml(cfg)
        )
        rd.event("run_start", runtime="flower", method=name, seed=seed)
        capture = _ResultCapture()
        record = run_method(cfg, job, ctx, runtime, rundir=rd, observers=[*observers, capture])
        report.write_metrics(
            rd.path / "metrics.json", [record], info={"config": to_dict(cfg), "runtime": "flower"}
        )
        notes = [
            f"runtime `flower`; data `{cfg.data.source}`, {cfg.partition.num_clients} clients, "
            f"partition `{cfg.partition.scheme}`, model `{cfg.model.name}`"
        ]
        rd.write_text(
            "summary.md",
            report.summary_markdown(
                report.summarize([record]), title=f"osfl Flower run: {cfg.name}", notes=notes
            ),
        )
        rd.event("run_end", records=1)
    log.info("osfl Flower run written to %s", out)
    return capture.result, record, out


#: The apps a Flower deployment loads (see the module docstring).
server_app = make_server_app(serve_experiment)
client_app = make_client_app(assembly.job_from_spec)
