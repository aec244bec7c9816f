"""Run an experiment: every method × seed of an
:class:`~osfl.config.ExperimentConfig` on its runtime, one record each — the
rows of ``metrics.json``.

Everything is built by :mod:`osfl.assembly`; this module only runs the loop
and writes the run directory's events. Data is loaded once per config; the
federation once per seed (its seed is the run seed unless ``partition.seed``
pins it); the client-training cache is shared by every method and seed, so
one-shot methods that start from the same locally trained clients train them
once (docs/design.md §2, §7). Every method is built and checked (``Method.check``)
before the first client trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.assembly import Plan, SeedContext, build_plan
from osfl.config import ExperimentConfig
from osfl.data.imageset import ImageSet
from osfl.fl.fingerprint import check_kernel_choice, onednn_isa
from osfl.fl.method import rounds_of
from osfl.fl.observers import Checkpointer, Observer
from osfl.fl.progress import Progress, ProgressTask
from osfl.fl.runtime.base import Job, Runtime
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.runtime.train_only import train_only
from osfl.kept_model import MODELS_DIR, keep_model
from osfl.record import RunRecord
from osfl.run_record import build_audit, run_record
from osfl.rundir import EventObserver, RunDir

log = logging.getLogger(__name__)

#: ``observers_for(method, seed, ctx) -> observers`` attaches extra observers per run.
ObserversFor = Callable[[str, int, SeedContext], Sequence[Observer]]
#: ``on_round(context, rounds)``: a running method's identifying fields and its
#: round records so far (so a run can save them before the method finishes).
OnRound = Callable[[Mapping[str, Any], list[dict[str, Any]]], None]


class RoundsSoFar(Observer):
    """Hands every finished round of one method to ``on_round``."""

    def __init__(self, context: Mapping[str, Any], on_round: OnRound):
        self.context, self.on_round = dict(context), on_round
        self.rounds: list[dict[str, Any]] = []

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        self.rounds.append(dict(metrics))
        self.on_round(self.context, list(self.rounds))


def _slug(name: str, seed: int, point: str) -> str:
    """A directory name for one (method, seed, grid point)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in point)
    return f"{name}-seed{seed}" + (f"-{safe}" if safe else "")


def run_context(name: str, seed: int, point: Mapping[str, str] | None) -> dict[str, Any]:
    """The identifying fields of a record: method, seed, grid point."""
    label = " ".join(f"{k}={v}" for k, v in (point or {}).items() if k != "seeds")
    return {"method": name, "seed": seed, "point": label, "sweep": dict(point or {})}


def state_dir(rundir: RunDir, name: str, seed: int, point: str) -> Path:
    """Where a job's server state is saved while it runs (``state/<slug>``):
    ``osfl run --resume`` continues an unfinished method from there; the
    directory goes once the method's record is in ``metrics.json``, and
    ``state/`` once it is empty."""
    return rundir.path / "state" / _slug(name, seed, point)


def model_dir(rundir: RunDir, name: str, seed: int, point: str) -> Path:
    """Where a finished job keeps its final server model (``models/<slug>``,
    :mod:`osfl.kept_model`): what ``osfl eval`` scores again."""
    return rundir.path / MODELS_DIR / _slug(name, seed, point)


def run_observers(
    cfg: ExperimentConfig, job: Job, context: Mapping[str, Any], rundir: RunDir | None
) -> list[Observer]:
    """The run directory's observers: a ``round`` event per round and, with
    ``checkpoint_every``, the server state every N rounds."""
    if rundir is None:
        return []
    where = rundir.path / "checkpoints" / _slug(job.method.name, job.seed, context["point"])
    obs: list[Observer] = [EventObserver(rundir, context)]
    if cfg.checkpoint_every:
        obs.append(Checkpointer(where, every=cfg.checkpoint_every))
    return obs


def run_method(
    cfg: ExperimentConfig,
    job: Job,
    ctx: SeedContext,
    runtime: Runtime,
    *,
    rundir: RunDir | None = None,
    point: Mapping[str, str] | None = None,
    observers: Sequence[Observer] = (),
    on_round: OnRound | None = None,
) -> RunRecord:
    """Run one built job on ``runtime``; returns its metrics record.
    ``on_round`` sees the rounds finished so far after every round. With a
    run directory, the job's final server model is kept in ``models/<slug>``
    (:func:`model_dir`), which ``osfl eval`` scores again."""
    name, seed = job.method.name, job.seed
    context = run_context(name, seed, point)
    if rundir is not None and job.state_dir is None:  # saved every round; resumed from there
        job = dataclasses.replace(job, state_dir=state_dir(rundir, name, seed, context["point"]))
    audit = build_audit(cfg, job, ctx, rundir.path if rundir else None, context)
    obs = [*observers, *run_observers(cfg, job, context, rundir)]
    if on_round is not None and rounds_of(job.method) > 1:
        obs.append(RoundsSoFar(context, on_round))
    if audit is not None:
        obs.append(audit.recorder)
    if rundir is not None:
        rundir.event("method_start", **context, method_config=dataclasses.asdict(job.method.config))
    cache = job.run.cache
    before = (cache.hits, cache.misses) if cache is not None else None
    result = _execute(cfg, job, runtime, obs)
    counts = (cache.hits - before[0], cache.misses - before[1]) if cache and before else None
    record = run_record(cfg, job, result, ctx, context, counts)
    if audit is not None:  # privacy audit: scored on what the server saw
        record = record.replace(audit=audit.finish())
    if rundir is not None:  # before the record is saved: a resumed run keeps both or reruns
        _keep(rundir, cfg, job, result, record, context)
    accuracy = record.ranked_accuracy
    log.info(
        "%s seed %d: accuracy %.4f, %d bytes up, %.1fs",
        name,
        seed,
        float("nan") if accuracy is None else accuracy,
        record.bytes_up,
        record.total_seconds,
    )
    return record


def _execute(cfg: ExperimentConfig, job: Job, runtime: Runtime, obs: list[Observer]) -> Any:
    """The job on ``runtime``, or (``train_clients``) part of its clients
    trained into the cache, with no global model."""
    if cfg.train_clients is None:
        return runtime.execute(job, observers=obs)
    return train_only(
        job,
        cfg.train_clients,
        threads=runtime.pinned_threads() if isinstance(runtime, SimulationRuntime) else None,
        batch_clients=cfg.batch_clients,
    )


def _keep(
    rundir: RunDir,
    cfg: ExperimentConfig,
    job: Job,
    result: Any,
    record: RunRecord,
    context: Mapping[str, Any],
) -> None:
    """The job's final server model in ``models/<slug>`` and its ``method_end`` event."""
    name, seed = job.method.name, job.seed
    keep_model(model_dir(rundir, name, seed, context["point"]), cfg, job, result, record)
    keys = ("global_test_accuracy", "mean_client_accuracy", "bytes_up", "time_s")
    exported = record.to_dict()  # the event holds the record's JSON values
    summary = {k: exported[k] for k in (*keys, "trained_clients") if k in exported}
    rundir.event("method_end", **context, **summary)


def plan_experiment(
    cfg: ExperimentConfig, *, runtime: Runtime | None = None, progress: Progress | None = None
) -> Plan:
    """Load the data, build every seed's federation and run context and every
    method's job, and run each method's ``check`` (:func:`osfl.assembly.build_plan`)
    — so an incompatible method (e.g. one that needs a ViT, or one that
    SecAgg+ cannot serve) fails before any client trains and before a run
    directory is made. ``runtime`` defaults to the config's."""
    check_kernel_choice()
    # read once here, before client threads run: its oneDNN probe briefly
    # redirects standard output (osfl.fl.fingerprint.onednn_isa)
    onednn_isa()
    return build_plan(cfg, runtime=runtime, progress=progress)


def execute_plan(
    plan: Plan,
    *,
    rundir: RunDir | None = None,
    point: Mapping[str, str] | None = None,
    observers_for: ObserversFor | None = None,
    on_record: Callable[[RunRecord], None] | None = None,
    on_round: OnRound | None = None,
    skip: Collection[tuple[str, str, int]] = (),
) -> list[RunRecord]:
    """Run every job of ``plan``; returns their records (seed-major, then method
    order). ``on_record`` sees each record as soon as it is finished (a run
    saves it then), ``on_round`` a multi-round method's rounds so far; jobs whose ``(point label, method, seed)`` is in ``skip``
    are not run (a resumed run finished them before). The partition heat map
    of each seed's federation is written to the run directory."""
    cfg, splits = plan.cfg, plan.splits
    if cfg.threads_per_client is not None:
        log.info(
            "%d client(s) at once, %d torch thread(s) each",
            cfg.parallel_clients,
            cfg.threads_per_client,
        )
    if rundir is not None and splits is not None:
        rundir.event("data", source=cfg.data.source, train=len(splits.train), test=len(splits.test))
    records: list[RunRecord] = []
    bar = _jobs_bar(plan, point, skip)
    for ctx, jobs in plan.seeds:
        if rundir is not None and ctx.federation is not None and splits is not None:
            fed = ctx.federation
            sizes = [len(i) for i in fed.client_indices]
            rundir.event("federation", seed=ctx.run.seed, key=fed.key(), sizes=sizes)
            _plot_partition(fed, splits.train, rundir.path)
        for job in jobs:
            label = run_context(job.method.name, job.seed, point)["point"]
            if (label, job.method.name, job.seed) in skip:
                continue
            extra = observers_for(job.method.name, job.seed, ctx) if observers_for else ()
            bar.advance(0, description=f"{job.method.name}, seed {job.seed}")
            record = run_method(
                cfg,
                job,
                ctx,
                plan.runtime,
                rundir=rundir,
                point=point,
                observers=extra,
                on_round=on_round,
            )
            records.append(record)
            if on_record is not None:
                on_record(record)
            if rundir is not None and on_record is not None:  # saved: no resume state needed
                drop_state(state_dir(rundir, job.method.name, job.seed, label))
            bar.advance()
    bar.close()
    return records


def _jobs_bar(
    plan: Plan, point: Mapping[str, str] | None, skip: Collection[tuple[str, str, int]]
) -> ProgressTask:
    """The live display's top bar: which method and seed run now, and how
    many of the plan's jobs are done (the other bars name the method only)."""
    jobs = [
        job
        for _, js in plan.seeds
        for job in js
        if (run_context(job.method.name, job.seed, point)["point"], job.method.name, job.seed)
        not in skip
    ]
    if not jobs:
        return ProgressTask()
    return jobs[0].run.progress.task("jobs", len(jobs))


def drop_state(where: Path) -> None:
    """Delete a finished job's resume state, and ``state/`` with it once no
    other job has any left (a finished run directory has no empty ``state/``)."""
    shutil.rmtree(where, ignore_errors=True)
    with contextlib.suppress(OSError):  # only if empty: another job's state stays
        where.parent.rmdir()


def run_experiment(
    cfg: ExperimentConfig,
    *,
    rundir: RunDir | None = None,
    point: Mapping[str, str] | None = None,
    observers_for: ObserversFor | None = None,
    runtime: Runtime | None = None,
    progress: Progress | None = None,
) -> list[RunRecord]:
    """Every method × seed of ``cfg`` (:func:`plan_experiment`, then
    :func:`execute_plan`); returns their records in that order."""
    plan = plan_experiment(cfg, runtime=runtime, progress=progress)
    return execute_plan(plan, rundir=rundir, point=point, observers_for=observers_for)


def _plot_partition(fed: Any, train: ImageSet, root: Path) -> None:
    """The clients' class-count heat map, one file per distinct federation
    (``partition-seed<seed>-<key>.png``; its title names scheme, parameters, seed)."""
    # heavy: matplotlib (~0.5 s; only a run that plots its partition needs it)
    from osfl.data.plot import plot_class_counts

    path = root / f"partition-seed{fed.seed}-{fed.key()[:10]}.png"
    if not path.exists():
        plot_class_counts(fed, path, class_names=list(train.classes))
