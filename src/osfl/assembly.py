"""The one place that turns a configuration into working parts.

``config -> data -> federation -> run context -> method (with its wrappers)
-> job -> runtime`` (a finished job's record: :mod:`osfl.run_record`);
:func:`build_plan` builds all of a config's parts in one call. ``osfl run``
(:mod:`osfl.experiment`), the Flower apps (:mod:`osfl.flower_app`) and
``osfl audit`` all build through here, so a simulation run, a Flower run and
a later audit of either see equal data, federations, models, transforms and
methods. Data flows one way (docs/design.md §3): this module imports the data,
model, FL-core, method and privacy layers; none of them imports it. It reads
the configuration; :mod:`osfl.parts` builds each part from what it read, so a
config value passes through here once on its way down.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from osfl import parts
from osfl.config import (
    ExperimentConfig,
    load_config,
    load_config_text,
    method_config,
    method_train_config,
    to_yaml,
)
from osfl.config.loading import default_partitions
from osfl.data.federation import Federation
from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.partition import PARTITIONS
from osfl.data.sources import DATASETS
from osfl.data.transforms import PIPELINES
from osfl.errors import ConfigError
from osfl.fl.context import RunContext
from osfl.fl.evaluate import Evaluator
from osfl.fl.method import METHODS, Method
from osfl.fl.progress import Progress
from osfl.fl.runtime.base import Job, Runtime
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.train_config import TrainConfig
from osfl.methods import default_methods  # importing osfl.methods registers every method
from osfl.models import MODELS
from osfl.parts import SeedContext
from osfl.privacy.audit import parse_audit
from osfl.privacy.defenses import defense_config
from osfl.registry import Registry
from osfl.robustness import byzantine_config

#: runtime name -> ``factory(cfg) -> Runtime`` (``runtime:`` in a config).
RUNTIMES: Registry[Callable[[ExperimentConfig], Runtime]] = Registry("runtime")
RUNTIMES.add(
    "simulation",
    lambda cfg: SimulationRuntime(
        cfg.parallel_clients, cfg.threads_per_client, batch_clients=cfg.batch_clients
    ),
)


# The Flower runtimes import flwr only when chosen: every other run works where
# Flower is not installed (a lent GPU machine has no flwr, docs/gpu-suite.md).
@RUNTIMES.register("flower")
def _flower_loopback(cfg: ExperimentConfig) -> Runtime:
    """Flower's Message API in this process (a loopback Grid)."""
    # optional: flwr, only for runtime=flower
    from osfl.flower.loopback import FlowerLoopbackRuntime

    return FlowerLoopbackRuntime(cfg.parallel_clients, cfg.threads_per_client)


@RUNTIMES.register("flower_engine")
def _flower_engine(cfg: ExperimentConfig) -> Runtime:
    """Flower's simulation engine (Ray actors build their jobs from the config's
    YAML), on the Ray cluster and with the waits of ``flower_engine.*``."""
    # optional: flwr, only for runtime=flower_engine
    from osfl.flower.engine import FlowerEngineRuntime
    from osfl.flower.spec import JobSpec  # optional: flwr, as above

    engine = cfg.flower_engine
    spec = JobSpec(
        experiment=to_yaml(cfg),
        node_timeout=float(engine.node_timeout),
        round_timeout=float(engine.round_timeout),
    )
    return FlowerEngineRuntime(job_from_spec, spec, ray_address=engine.ray_address)


#: The runtimes that pin ``threads_per_client`` torch threads for their clients
#: (Flower's engine gives each Ray actor its CPUs; a deployment's SuperNodes set
#: OMP_NUM_THREADS themselves).
THREADED_RUNTIMES = ("simulation", "flower")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS tells)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux only
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def resolve_parallel(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with ``parallel_clients: auto`` replaced by the count it means
    here: the usable CPUs divided by ``threads_per_client`` (at least one).
    The count does not change results (seeded clients, aggregation in client
    order), only how long they take; ``threads_per_client`` is pinned only on
    the runtimes that pin threads (``None`` elsewhere, as the records say)."""
    threads = cfg.threads_per_client if cfg.runtime in THREADED_RUNTIMES else None
    parallel = cfg.parallel_clients
    if parallel == "auto":
        parallel = max(1, usable_cpus() // (threads or 1))
    return dataclasses.replace(cfg, parallel_clients=parallel, threads_per_client=threads)


def build_runtime(cfg: ExperimentConfig) -> Runtime:
    if cfg.secagg.enabled and cfg.runtime != "flower":
        raise ConfigError(
            "secagg.enabled needs runtime=flower (SecAgg+ runs over a Flower Grid: the "
            f"loopback one, or a deployment's), got runtime={cfg.runtime!r}"
        )
    return RUNTIMES.get(cfg.runtime)(resolve_parallel(cfg))


# --------------------------------------------------------------------------- names
def method_names(cfg: ExperimentConfig) -> list[str]:
    """``cfg.methods``, or the default-run methods when empty; every name and
    every per-method override is validated here, before anything runs."""
    names = list(cfg.methods) or default_methods()
    for n in names:
        METHODS.get(n)  # unknown -> ConfigError listing the valid ones
    for n, overrides in cfg.method.items():  # bad options fail now, not after hours of training
        method_config(METHODS.get(n), overrides)
    for n in cfg.method_train:
        train_recipe(cfg, n)
    return [n.lower() for n in names]


def check_names(cfg: ExperimentConfig) -> list[str]:
    """Validate every registry name of ``cfg`` up front (data source, scheme,
    model, transforms, runtime, methods and their options, privacy options) so
    that a typo in the last grid point of a sweep fails before the first one
    trains. Returns the resolved method names."""
    names = _check_registered(cfg)
    _check_options(cfg)
    return names


def _check_registered(cfg: ExperimentConfig) -> list[str]:
    """The method names (:func:`method_names`) and every other registry name
    of ``cfg`` checked; the checks that read nothing but the config."""
    names = method_names(cfg)
    DATASETS.get(cfg.data.source.partition(":")[0].strip())
    PARTITIONS.get(cfg.partition.scheme)
    MODELS.get(cfg.model.name)
    PIPELINES.get(cfg.transform.train)
    PIPELINES.get(cfg.transform.eval)
    RUNTIMES.get(cfg.runtime)
    return names


def _check_options(cfg: ExperimentConfig) -> None:
    """The privacy and robustness options, each parsed by its own layer."""
    defense_config(cfg.defense)
    byzantine = byzantine_config(cfg.byzantine)
    if byzantine is not None:
        byzantine.check_clients(cfg.partition.num_clients)
    if cfg.server.min_clients > cfg.partition.num_clients:
        raise ConfigError(
            f"server.min_clients={cfg.server.min_clients} exceeds the run's "
            f"{cfg.partition.num_clients} clients: no round could ever be aggregated"
        )
    parse_audit(cfg.audit)


# --------------------------------------------------------------------------- reading
# Each function below reads one part of the config into the plain request its
# builder in osfl.parts takes; the builders never see the config.
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is visible; use device=cpu or device=auto")
    return dev


def data_request(cfg: ExperimentConfig) -> parts.DataRequest:
    """What ``cfg.data`` asks to load (only the options that are set)."""
    d = cfg.data
    named = {"image_size": d.image_size, "channels": d.channels, "max_per_class": d.max_per_class}
    named["cache_dir"] = d.cache_dir
    opts = {k: v for k, v in named.items() if v is not None} | dict(d.options)
    return parts.DataRequest(d.source, opts, d.classes or None, d.validation_fraction)


def federation_request(cfg: ExperimentConfig) -> parts.FederationRequest:
    """How ``cfg.partition`` splits the train set (``partition.seed`` pins it),
    cached as JSON under ``cache_dir`` when one is set."""
    p = cfg.partition
    params = p.scheme_params(_scheme_fields(p.scheme))
    saved = p.from_file is not None  # a saved split, checked against what was asked
    return parts.FederationRequest(
        scheme=p.scheme,
        num_clients=p.num_clients,
        params=params,
        seed=p.seed,
        from_file=p.from_file,
        asked=dataclasses.asdict(p) if saved else None,
        defaults=default_partitions() if saved else (),
        cache_dir=cfg.cache_dir,
    )


def _scheme_fields(name: str) -> set[str]:
    """The parameters partition scheme ``name`` takes (its dataclass fields)."""
    scheme = PARTITIONS.get(name)
    return (
        {f.name for f in dataclasses.fields(scheme)} if dataclasses.is_dataclass(scheme) else set()
    )


def run_request(cfg: ExperimentConfig) -> parts.RunRequest:
    """The run context's values: model, recipe, transforms, device, cache,
    the server's public rules."""
    tf = cfg.transform
    return parts.RunRequest(
        model=cfg.model.name,
        model_kwargs=dict(cfg.model.kwargs),
        train=cfg.train,
        train_pipeline=tf.train,
        eval_pipeline=tf.eval,
        normalisation=tf.normalisation(),
        image_size=cfg.data.image_size,
        device=resolve_device(cfg.device),
        cache_dir=cfg.cache_dir,
        server=cfg.server,
        secagg=cfg.secagg,
    )


def train_recipe(cfg: ExperimentConfig, name: str) -> tuple[TrainConfig, dict[str, str]]:
    """Method ``name``'s local-training recipe, resolved here once for every
    party, and where each of its values that differs from ``train.*`` came
    from (the record's ``train_sources``). Precedence, lowest first: the run's
    ``train.*``; the method's ``card.train_defaults`` (a variant's own recipe, e.g.
    ``fafi_code``'s gradient clipping); the user's ``method_train.<name>.*``,
    refused for a method that does not train with the recipe
    (``Method.trains_with_recipe``)."""
    method = METHODS.get(name)
    defaults = dict(method.card.train_defaults)
    user = dict(cfg.method_train.get(name) or {})
    train = method_train_config(dataclasses.replace(cfg.train, **defaults), user, name, method)
    where = {k: f"{name} default" for k in defaults} | {k: f"method_train.{name}" for k in user}
    return train, {k: w for k, w in where.items() if getattr(train, k) != getattr(cfg.train, k)}


def method_request(cfg: ExperimentConfig, name: str) -> parts.MethodRequest:
    """Method ``name`` as ``cfg`` asks for it: its options (``cfg.method[name]``),
    its recipe (:func:`train_recipe`), the client-side ``defense`` and
    ``byzantine`` wrappers; a robust ``server.aggregator`` is refused for a
    method that does not combine weights with it."""
    cls = METHODS.get(name)
    rule = cfg.server.aggregator
    if rule != "mean" and not cls.card.server_rule:
        raise ConfigError(
            f"server.aggregator={rule!r} is a rule for combining clients' model weights, and "
            f"{name} does not combine weights with it; run {name} with server.aggregator=mean "
            "(its own defences, e.g. server.member_filter for an ensemble or "
            "method.fafi.fusion=median: docs/robustness.md)"
        )
    train, sources = train_recipe(cfg, name)
    config = method_config(cls, cfg.method.get(name, {}))
    return parts.MethodRequest(name, cls, config, train, sources, cfg.defense, cfg.byzantine)


# --------------------------------------------------------------------------- one part at a time
# The front ends that build one part (osfl eval, osfl audit, the Flower apps,
# the suite's preflight, tests): each reads its part of the config here and
# builds it in osfl.parts, as build_plan does.
def load_splits(cfg: ExperimentConfig) -> DataSplits:
    """The train/test ImageSets of ``cfg.data`` (only the options that are set),
    restricted to ``data.classes`` in that label order when it is given."""
    return parts.load_splits(data_request(cfg))


def build_federation(cfg: ExperimentConfig, train: ImageSet, seed: int) -> Federation:
    """The clients' split of ``train`` for ``seed`` (``partition.seed`` pins it)."""
    return parts.build_federation(federation_request(cfg), train, seed)


def build_transforms(cfg: ExperimentConfig, train: ImageSet | None) -> tuple[Any, Any]:
    """``(train, eval)`` batched transforms (:func:`osfl.parts.build_transforms`)."""
    return parts.build_transforms(run_request(cfg), train)


def pretrained_weights(cfg: ExperimentConfig, train: ImageSet | None) -> dict[str, Any] | None:
    """The pretrained checkpoint's info (:func:`osfl.parts.pretrained_weights`)."""
    return parts.pretrained_weights(cfg.model.kwargs.get("pretrained"), cfg.data.source, train)


def run_context(cfg: ExperimentConfig, **task: Any) -> RunContext:
    """The RunContext of a task (:func:`osfl.parts.run_context`; ``task``: its
    ``image_shape``, ``classes``, ``num_clients``, ``seed``, ``stats_from``,
    ``progress`` and ``weights``)."""
    return parts.run_context(run_request(cfg), **task)


def build_run(
    cfg: ExperimentConfig,
    splits: DataSplits,
    federation: Federation,
    seed: int,
    progress: Progress | None = None,
) -> RunContext:
    """The RunContext every party of a rehearsal shares."""
    train = splits.train
    return parts.run_context(
        run_request(cfg),
        image_shape=train.image_shape,
        classes=train.classes,
        num_clients=len(federation.client_indices),
        seed=seed,
        stats_from=train,
        progress=progress,
        weights=pretrained_weights(cfg, train),
    )


def seed_context(
    cfg: ExperimentConfig, splits: DataSplits, seed: int, progress: Progress | None = None
) -> SeedContext:
    """One seed's federation and run context (:func:`osfl.parts.seed_context`)."""
    weights = pretrained_weights(cfg, splits.train)
    fed, run = federation_request(cfg), run_request(cfg)
    return parts.seed_context(splits, seed, fed, run, weights, progress)


def build_method(
    cfg: ExperimentConfig, name: str, run: RunContext, sizes: Sequence[int] | None = None
) -> Method:
    """Method ``name`` on ``run`` with its wrappers (:func:`osfl.parts.build_method`)."""
    return parts.build_method(method_request(cfg, name), run, sizes)


def test_evaluator(test: ImageSet, run: RunContext) -> Evaluator:
    """Accuracy of a predictor on ``test`` (global and per class)."""
    return Evaluator(test, run.eval_transform, run.device)


def method_run(cfg: ExperimentConfig, name: str, run: RunContext) -> RunContext:
    """``run`` with method ``name``'s local-training recipe (:func:`train_recipe`)."""
    train, _ = train_recipe(cfg, name)
    return run if train == run.train else dataclasses.replace(run, train=train)


def build_job(cfg: ExperimentConfig, name: str, ctx: SeedContext) -> Job:
    """Method ``name`` × the seed of ``ctx``, ready for a runtime."""
    req = method_request(cfg, name)
    return parts.build_job(req, ctx, eval_local=cfg.eval_local, eval_every=cfg.eval_every)


def check_jobs(cfg: ExperimentConfig, jobs: Sequence[Job]) -> None:
    """What the run asks of every job (:func:`osfl.parts.check_jobs`)."""
    parts.check_jobs(
        jobs, train_clients=cfg.train_clients, secagg=cfg.secagg.enabled, server=cfg.server
    )


# --------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """One config's work, built and checked before anything trains: its data,
    and per seed the federation, run context and one job per method."""

    cfg: ExperimentConfig
    splits: DataSplits | None  # None: a real-sites server holds no data
    runtime: Runtime
    seeds: list[tuple[SeedContext, list[Job]]]


@dataclass(frozen=True)
class Reading:
    """Everything :func:`build_plan` builds from, read off the config once:
    the requests of :mod:`osfl.parts`, the run's own knobs and the runtime."""

    cfg: ExperimentConfig  # parallel_clients resolved: the records carry it and the threads
    data: parts.DataRequest
    federation: parts.FederationRequest
    run: parts.RunRequest
    methods: tuple[parts.MethodRequest, ...]
    runtime: Runtime


def read_config(cfg: ExperimentConfig, runtime: Runtime | None = None) -> Reading:
    """The one reading of ``cfg`` for a plan: every name checked, each part's
    request, the runtime (``runtime`` defaults to the config's); the checks
    that hand an option to its own layer last."""
    names = _check_registered(cfg)
    reading = Reading(
        cfg=resolve_parallel(cfg),
        data=data_request(cfg),
        federation=federation_request(cfg),
        run=run_request(cfg),
        methods=tuple(method_request(cfg, n) for n in names),
        runtime=runtime or build_runtime(cfg),
    )
    _check_options(cfg)
    return reading


def build_plan(
    cfg: ExperimentConfig, *, runtime: Runtime | None = None, progress: Progress | None = None
) -> Plan:
    """Every part of ``cfg``'s run, each built once: the config read once
    (:func:`read_config`), then, by :mod:`osfl.parts` from what was read, the
    data, per seed its federation, run context and one checked job per
    method. The one call a front end makes to turn a config into work."""
    r = read_config(cfg, runtime)
    c = r.cfg
    splits = parts.load_splits(r.data)
    weights = parts.pretrained_weights(
        r.run.model_kwargs.get("pretrained"), r.data.source, splits.train
    )
    seeds = []
    for seed in c.seeds:
        ctx = parts.seed_context(splits, seed, r.federation, r.run, weights, progress)
        jobs = [
            parts.build_job(m, ctx, eval_local=c.eval_local, eval_every=c.eval_every)
            for m in r.methods
        ]
        parts.check_jobs(
            jobs, train_clients=c.train_clients, secagg=c.secagg.enabled, server=c.server
        )
        seeds.append((ctx, jobs))
    return Plan(c, splits, r.runtime, seeds)


# --------------------------------------------------------------------------- Flower
def load_experiment(spec: Any) -> tuple[ExperimentConfig, str, int]:
    """``(config, method name, seed)`` of a Flower :class:`~osfl.flower.spec.JobSpec`.

    ``spec.experiment`` is a YAML file path, YAML text (it holds a newline or
    a ``key: value``), or ``""`` for the embedded default experiment.
    """
    text = spec.experiment.strip()
    overrides = list(spec.overrides)
    if not text:
        cfg = load_config(None, overrides)
    elif "\n" not in text and _is_file(text):
        cfg = load_config(text, overrides)
    elif "\n" in text or ": " in text:
        cfg = load_config_text(text, overrides)
    else:
        raise ConfigError(
            f"run config 'experiment' = {text!r} is neither an existing YAML file nor YAML "
            "text; give an absolute path readable by the SuperLink and every SuperNode"
        )
    methods = method_names(cfg)
    name = (spec.method or methods[0]).lower()
    METHODS.get(name)  # unknown -> ConfigError listing the valid ones
    seed = int(cfg.seeds[0] if spec.seed is None else spec.seed)
    return cfg, name, seed


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # e.g. a name too long to be a path
        return False


def job_from_spec(spec: Any) -> Job:
    """The job of a Flower :class:`~osfl.flower.spec.JobSpec`, built
    exactly as ``osfl run`` builds one method × seed (every SuperNode and the
    ServerApp call this and so hold equal jobs)."""
    cfg, name, seed = load_experiment(spec)
    ctx = seed_context(cfg, load_splits(cfg), seed)
    return build_job(cfg, name, ctx)
