"""Run an experiment: every method × seed of an
:class:`~osfl.config.ExperimentConfig` on its runtime, one record each — the
rows of ``metrics.json``.

Everything is built by :mod:`osfl.assembly`; this module only runs the loop
and writes the run directory's events. Data is loaded once per config; the
federation once per seed (its seed is the run seed unless ``partition.seed``
pins it); the client-training cache is shared by every method and seed, so
one-shot methods that start from the same locally trained clients train them
once (DESIGN.md §2, §7). Every method is built and checked (``Method.check``)
before the first client trains.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl import assembly
from osfl.assembly import SeedContext
from osfl.config import ExperimentConfig
from osfl.data.imageset import ImageSet
from osfl.fl.observers import Checkpointer, Observer
from osfl.fl.progress import Progress
from osfl.fl.runtime.base import Job, Runtime
from osfl.rundir import EventObserver, RunDir

log = logging.getLogger(__name__)

#: ``observers_for(method, seed, ctx) -> observers`` attaches extra observers per run.
ObserversFor = Callable[[str, int, SeedContext], Sequence[Observer]]


def _slug(name: str, seed: int, point: str) -> str:
    """A directory name for one (method, seed, grid point)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in point)
    return f"{name}-seed{seed}" + (f"-{safe}" if safe else "")


def run_context(name: str, seed: int, point: Mapping[str, str] | None) -> dict[str, Any]:
    """The identifying fields of a record: method, seed, grid point."""
    label = " ".join(f"{k}={v}" for k, v in (point or {}).items() if k != "seeds")
    return {"method": name, "seed": seed, "point": label, "sweep": dict(point or {})}


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
) -> dict[str, Any]:
    """Run one built job on ``runtime``; returns its metrics record."""
    name, seed = job.method.name, job.seed
    context = run_context(name, seed, point)
    audit = assembly.build_audit(cfg, job, ctx, rundir.path if rundir else None, context)
    obs = [*observers, *run_observers(cfg, job, context, rundir)]
    if audit is not None:
        obs.append(audit.recorder)
    if rundir is not None:
        rundir.event("method_start", **context, method_config=dataclasses.asdict(job.method.config))
    cache = job.run.cache
    before = (cache.hits, cache.misses) if cache is not None else None
    result = runtime.execute(job, observers=obs)
    counts = (cache.hits - before[0], cache.misses - before[1]) if cache and before else None
    record = assembly.run_record(cfg, job, result, ctx, context, counts)
    if audit is not None:  # privacy audit: scored on what the server saw
        record["audit"] = audit.finish()
    if rundir is not None:
        summary = {k: record[k] for k in ("global_test_accuracy", "bytes_up", "time_s")}
        rundir.event("method_end", **context, **summary)
    log.info(
        "%s seed %d: accuracy %.4f, %d bytes up, %.1fs",
        name,
        seed,
        record.get("global_test_accuracy", float("nan")),
        record["bytes_up"],
        record["time_s"]["total"],
    )
    return record


def run_experiment(
    cfg: ExperimentConfig,
    *,
    rundir: RunDir | None = None,
    point: Mapping[str, str] | None = None,
    observers_for: ObserversFor | None = None,
    runtime: Runtime | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every method × seed of ``cfg``; returns their records (in that order).

    Every job is built and checked before the first one runs, so an
    incompatible method (e.g. one that needs a ViT) fails at once.
    ``runtime`` defaults to the config's; ``progress`` is the board long loops
    report to; the partition heat map of each seed's federation is written to
    the run directory.
    """
    methods = assembly.check_names(cfg)
    splits = assembly.load_splits(cfg)
    runtime = runtime or assembly.build_runtime(cfg)
    if rundir is not None:
        rundir.event("data", source=cfg.data.source, train=len(splits.train), test=len(splits.test))
    plan: list[tuple[SeedContext, list[Job]]] = []
    for seed in cfg.seeds:
        ctx = assembly.seed_context(cfg, splits, seed, progress)
        jobs = [assembly.build_job(cfg, name, ctx) for name in methods]
        for job in jobs:
            job.method.check()
        plan.append((ctx, jobs))
    records = []
    for ctx, jobs in plan:
        if rundir is not None:
            fed = ctx.federation
            sizes = [len(i) for i in fed.client_indices]
            rundir.event("federation", seed=ctx.run.seed, key=fed.key(), sizes=sizes)
            _plot_partition(fed, splits.train, rundir.path)
        for job in jobs:
            extra = observers_for(job.method.name, job.seed, ctx) if observers_for else ()
            records.append(
                run_method(cfg, job, ctx, runtime, rundir=rundir, point=point, observers=extra)
            )
    return records


def _plot_partition(fed: Any, train: ImageSet, root: Path) -> None:
    from osfl.data.plot import plot_class_counts

    path = root / f"partition-{fed.key()[:10]}.png"
    if not path.exists():
        plot_class_counts(
            fed, path, class_names=list(train.classes), title=f"{fed.scheme} {fed.params}"
        )
