"""The ServerApp and ClientApp a Flower deployment of osfl loads
(``osfl.flower_app.apps:server_app`` / ``:client_app``).

Both sides start from the same :class:`~osfl.flower.spec.JobSpec`
(Flower's run config) and build with :mod:`osfl.assembly` — the functions
``osfl run`` uses — so a Flower run and a simulation run of one config,
method and seed hold equal data, federation, model, recipe and method.

- Clients (SuperNodes, Flower-simulation actors): :func:`osfl.assembly.job_from_spec`.
- Server: :func:`serve_experiment` runs the job on a
  :class:`~osfl.flower.grid.FlowerGridRuntime` holding the
  ServerApp's Grid and writes a run directory like ``osfl run``, whose record
  is built by the same code as a simulation record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from osfl import assembly, report, site_assembly
from osfl.config import to_dict, to_yaml
from osfl.errors import ConfigError
from osfl.experiment import Plan, execute_plan, plan_experiment
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import RunResult
from osfl.fl.runtime.sites import SiteRegistry
from osfl.flower.claims import KEEP_NODE, REGISTRY
from osfl.flower.client import make_client_app
from osfl.flower.grid import make_server_app
from osfl.flower.secagg_client import add_secure_train
from osfl.flower.secagg_server import grid_runtime
from osfl.flower.spec import JobSpec
from osfl.record import RunRecord
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
) -> tuple[RunResult | None, RunRecord, Path]:
    """The ServerApp side of an experiment job: run it over ``grid`` and write
    a run directory like ``osfl run`` does (``config.yaml``, ``metrics.json``,
    ``events.jsonl``, ``summary.md``, ``run.log``), saving the server state
    after every round and every accepted upload.

    Returns ``(RunResult, metrics record, run directory)``. The run directory
    is ``spec.out_dir``, or ``runs/<stamp>-<name>-flower`` under the
    ServerApp's working directory (the SuperLink's). ``spec.resume`` goes on
    with the unfinished run in ``out_dir``: finished rounds and uploads
    accepted before the stop are not asked for again. ``spec.sites``: the
    server holds no client data (:mod:`osfl.site_assembly`).
    """
    cfg, name, seed = assembly.load_experiment(spec)
    cfg = dataclasses.replace(cfg, runtime="flower", methods=[name], seeds=[seed])
    out = Path(spec.out_dir) if spec.out_dir else RunDir.default_path(f"{cfg.name}-flower")
    config_text = f"# osfl Flower run: method {name}, seed {seed}\n" + to_yaml(cfg)
    _check_out_dir(out, config_text, resume=spec.resume)
    registry = _registry(spec, cfg)
    runtime = grid_runtime(
        grid,
        cfg.secagg,
        round_timeout=spec.round_timeout,
        node_timeout=spec.node_timeout,
        bindings=_bindings(spec, registry),
    )
    # data (none at real sites), job and its checks: before any client trains
    plan = (
        _site_plan(cfg, name, seed, spec, runtime, registry)
        if spec.sites
        else plan_experiment(cfg, runtime=runtime)
    )
    _log_to_flower()
    with RunDir(out, mode="resume" if spec.resume else "new") as rd:
        rd.write_text("config.yaml", config_text)
        rd.event("run_start", runtime="flower", method=name, seed=seed, resumed=spec.resume)
        capture = _ResultCapture()
        info: dict[str, Any] = {"config": to_dict(cfg), "runtime": "flower", "sites": spec.sites}

        def rounds_so_far(context: Mapping[str, Any], rounds: list[dict[str, Any]]) -> None:
            progress = {**context, "rounds": rounds}
            report.write_metrics(
                rd.path / "metrics.json", [], info={**info, "in_progress": progress}
            )

        (record,) = execute_plan(
            plan,
            rundir=rd,
            observers_for=lambda *_: [*observers, capture],
            on_round=rounds_so_far,
            on_record=lambda r: report.write_metrics(rd.path / "metrics.json", [r], info=info),
        )
        data = f"sites ({cfg.partition.num_clients})" if spec.sites else f"`{cfg.data.source}`"
        notes = [
            f"runtime `flower`; data {data}, {cfg.partition.num_clients} clients, "
            f"partition `{'sites' if spec.sites else cfg.partition.scheme}`, "
            f"model `{cfg.model.name}`"
        ]
        rd.write_text(
            "summary.md",
            report.summary_markdown(
                report.summarize([record]), title=f"osfl Flower run: {cfg.name}", notes=notes
            ),
        )
        rd.event("run_end", records=1)
    log.info(
        "osfl Flower run: %s seed %d, accuracy %.4f, %d bytes up; written to %s",
        name,
        seed,
        _nan_if_none(record.ranked_accuracy),
        record.bytes_up,
        out,
    )
    return capture.result, record, out


def _nan_if_none(accuracy: float | None) -> float:
    """NaN for a record without an accuracy, for the ``%.4f`` of a log line."""
    return float("nan") if accuracy is None else accuracy


def _check_out_dir(out: Path, config_text: str, *, resume: bool) -> None:
    """Refuse, before training, to write over a finished run or to resume
    another experiment's."""
    if not resume and (out / "metrics.json").exists():
        raise ConfigError(
            f"run directory {out} already holds a metrics.json: give this run another "
            "out-dir (flwr run ... --run-config 'out-dir=\"<new dir>\"'), resume it "
            "(--run-config 'resume=true'), or leave out-dir empty for a fresh "
            "runs/<stamp>-<name>-flower"
        )
    if resume:
        stored = out / "config.yaml"
        if not stored.is_file():
            raise ConfigError(f"resume: {out} holds no osfl Flower run (no config.yaml)")
        if stored.read_text().strip() != config_text.strip():
            raise ConfigError(
                f"resume: {stored} is another experiment's config; resume with the same "
                "experiment, method, seed and overrides"
            )
        if (out / "metrics.json").is_file() and report.read_metrics(out / "metrics.json")[
            "records"
        ]:
            raise ConfigError(f"resume: the run in {out} has finished; nothing to resume")


def _registry(spec: JobSpec, cfg: Any) -> SiteRegistry | None:
    """The site registry of run config ``site-registry``, checked against the
    run: every site once, no declared size above ``server.max_num_samples``.
    Read in a rehearsal too: its node ids bind the nodes there as well."""
    if not spec.site_registry:
        return None
    registry = SiteRegistry.from_file(spec.site_registry)
    registry.check(cfg.partition.num_clients, cfg.server.max_num_samples)
    return registry


def _bindings(spec: JobSpec, registry: SiteRegistry | None) -> list[tuple[str, dict[int, int]]]:
    """What the operator said about which node plays which site: the
    registry's node ids and run config ``keep-node`` (:mod:`osfl.flower.claims`)."""
    out = [(REGISTRY, registry.node_ids())] if registry is not None else []
    return out + ([(KEEP_NODE, dict(spec.keep_nodes))] if spec.keep_nodes else [])


def _site_plan(
    cfg: Any, name: str, seed: int, spec: JobSpec, runtime: Any, registry: SiteRegistry | None
) -> Plan:
    """The plan of a real-sites server: one job, no client data; the site
    registry (run config ``site-registry``) binds each site to its node's key
    and bounds its ``num_samples`` by the size it declared."""
    if registry is None:
        log.warning(
            "no site-registry: each site is taken at its word for its partition-id and "
            "num_samples is bounded only by server.max_num_samples=%d (docs/flower-security.md)",
            cfg.server.max_num_samples,
        )
    job = site_assembly.site_server_job(cfg, name, seed, spec.server_test, registry=registry)
    job.method.check()
    cfg = dataclasses.replace(cfg, threads_per_client=None)  # the sites pin their own threads
    return Plan(cfg, None, runtime, [(assembly.SeedContext(None, None, job.run), [job])])


class _NoStopEcho(logging.Filter):
    """Drops the run directory's "run stopped: ..." line from the ServerApp's
    stream: Flower logs the ServerApp's exception itself (one line for an
    osfl error, :class:`~osfl.flower.grid.OneLineOsflErrors`) and ``osfl flower
    run`` ends with the run's status, so a refused site's reason would be
    printed three times. The line stays in the run directory's ``run.log``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "osfl.rundir" and str(record.msg).startswith("run stopped"))


def _log_to_flower() -> None:
    """osfl's INFO lines (each method's accuracy, the run directory) on the
    ServerApp's stderr, which ``flwr run --stream`` shows; unless the process
    already gave the ``osfl`` logger a handler."""
    logger = logging.getLogger("osfl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("osfl: %(message)s"))
        handler.addFilter(_NoStopEcho())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


#: The apps a Flower deployment loads (see the module docstring).
server_app = make_server_app(serve_experiment)
# SecAgg+'s handler too: a run with secagg.enabled sends it Flower's "train" messages.
client_app = add_secure_train(
    make_client_app(site_assembly.job_for_spec), site_assembly.job_for_spec
)
