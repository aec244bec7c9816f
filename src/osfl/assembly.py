"""The one place that turns a configuration into working parts.

``config -> data -> federation -> run context -> method (with its wrappers)
-> job -> runtime`` (a finished job's record: :mod:`osfl.run_record`). ``osfl run``
(:mod:`osfl.experiment`), the Flower apps (:mod:`osfl.flower.app`) and
``osfl audit`` all build through here, so a simulation run, a Flower run and
a later audit of either see equal data, federations, models, transforms and
methods. Data flows one way (docs/design.md §3): this module imports the data,
model, FL-core, method and privacy layers; none of them imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osfl.config import (
    ExperimentConfig,
    load_config,
    load_config_text,
    method_config,
    method_train_config,
    to_yaml,
)
from osfl.config.loading import default_partitions
from osfl.data.classes import keep_classes
from osfl.data.federation import Federation
from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.partition import PARTITIONS, make_federation
from osfl.data.saved_split import load_saved_split
from osfl.data.sources import DATASETS, load_data
from osfl.data.transforms import PIPELINES, build_transform, channel_stats
from osfl.errors import ConfigError
from osfl.fl.cache import ClientCache
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.evaluate import evaluate, local_test_accuracy
from osfl.fl.method import METHODS, Method, give_validation
from osfl.fl.progress import Progress
from osfl.fl.runtime.base import Job, PartitionedData, Runtime
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.methods import default_methods  # importing osfl.methods registers every method
from osfl.models import MODELS
from osfl.pretrain.card import check_disjoint, pretrained_info
from osfl.privacy.audit import parse_audit
from osfl.privacy.defenses import apply_defense, defense_config
from osfl.registry import Registry
from osfl.robustness import apply_byzantine, byzantine_config

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
    DATASETS.get(cfg.data.source.partition(":")[0].strip())
    PARTITIONS.get(cfg.partition.scheme)
    MODELS.get(cfg.model.name)
    PIPELINES.get(cfg.transform.train)
    PIPELINES.get(cfg.transform.eval)
    RUNTIMES.get(cfg.runtime)
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
    return method_names(cfg)


# --------------------------------------------------------------------------- data
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is visible; use device=cpu or device=auto")
    return dev


def load_splits(cfg: ExperimentConfig) -> DataSplits:
    """The train/test ImageSets of ``cfg.data`` (only the options that are set),
    restricted to ``data.classes`` in that label order when it is given."""
    d = cfg.data
    named = {"image_size": d.image_size, "channels": d.channels, "max_per_class": d.max_per_class}
    named["cache_dir"] = d.cache_dir
    opts = {k: v for k, v in named.items() if v is not None} | dict(d.options)
    splits = load_data(d.source, **opts)
    splits = keep_classes(splits, d.classes, d.source) if d.classes else splits
    return carve_validation(splits, d.validation_fraction) if d.validation_fraction else splits


def carve_validation(splits: DataSplits, fraction: float) -> DataSplits:
    """``splits`` with ``fraction`` of each class of the train set (rounded
    half up, at least one where a class has two samples or more) moved to a
    validation set; the draw is seeded by the data alone, so every run seed
    and every method sees the same validation samples."""
    labels = splits.train.labels.numpy()
    rng = np.random.default_rng(derive_seed(0, "validation", splits.train.fingerprint()))
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n = min(len(idx) - 1, max(1, int(np.floor(fraction * len(idx) + 0.5))))
        held.append(np.sort(rng.choice(idx, size=n, replace=False)) if n > 0 else idx[:0])
    val = np.sort(np.concatenate(held))
    keep = np.setdiff1d(np.arange(len(labels)), val)
    return dataclasses.replace(
        splits, train=splits.train.subset(keep), validation=splits.train.subset(val)
    )


def partition_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """The scheme's parameters: named fields the scheme does not take are left
    out (``alpha`` means nothing to ``iid``), explicit ``options`` go as given."""
    scheme = PARTITIONS.get(cfg.partition.scheme)
    accepted = (
        {f.name for f in dataclasses.fields(scheme)} if dataclasses.is_dataclass(scheme) else set()
    )
    params = cfg.partition.params()
    explicit = set(cfg.partition.options)
    return {k: v for k, v in params.items() if k in accepted or k in explicit}


def build_federation(cfg: ExperimentConfig, train: ImageSet, seed: int) -> Federation:
    """The clients' split of ``train`` for ``seed`` (``partition.seed`` pins it),
    cached as JSON under ``cache_dir`` when one is set."""
    p = cfg.partition
    if p.from_file is not None:  # a saved split, the same for every seed
        asked, defaults = dataclasses.asdict(p), default_partitions()
        return load_saved_split(
            p.from_file, train.labels, train.domains, p.num_clients, asked=asked, defaults=defaults
        )
    return make_federation(
        train.labels,
        p.scheme,
        p.num_clients,
        p.seed if p.seed is not None else seed,
        domains=train.domains,
        num_classes=train.num_classes,
        cache_dir=cfg.cache_dir,
        **partition_params(cfg),
    )


def build_transforms(cfg: ExperimentConfig, train: ImageSet | None) -> tuple[Any, Any]:
    """``(train, eval)`` batched transforms, normalised with ``transform.mean``
    / ``std`` when given, else with the train set's channel statistics (what
    every party of a rehearsal computes the same way)."""
    tf = cfg.transform
    if (tf.mean is None) != (tf.std is None):
        raise ConfigError("give both transform.mean and transform.std, or neither")
    if tf.mean is not None and tf.std is not None:
        if len(tf.mean) != len(tf.std) or not all(s > 0 for s in tf.std):
            raise ConfigError(
                "transform.mean and transform.std need one value per channel, std > 0"
            )
        mean, std = tuple(tf.mean), tuple(tf.std)
    elif train is not None:
        mean, std = channel_stats(train)
    else:
        raise ConfigError(
            "transform.mean and transform.std are needed where no party holds the whole "
            "train set (real sites): set them, e.g. transform.mean=[0.5,0.5,0.5] "
            "transform.std=[0.25,0.25,0.25]"
        )
    size = train.image_shape[1] if train is not None else cfg.data.image_size
    return (
        build_transform(tf.train, image_size=size, mean=mean, std=std),
        build_transform(tf.eval, image_size=size, mean=mean, std=std),
    )


def build_run(
    cfg: ExperimentConfig,
    splits: DataSplits,
    federation: Federation,
    seed: int,
    progress: Progress | None = None,
) -> RunContext:
    """The RunContext every party of a rehearsal shares (the task read off
    the train set, transforms normalised with its statistics)."""
    train = splits.train
    return run_context(
        cfg,
        image_shape=train.image_shape,
        classes=train.classes,
        num_clients=len(federation.client_indices),
        seed=seed,
        stats_from=train,
        progress=progress,
        weights=pretrained_weights(cfg, train),
    )


@functools.lru_cache(maxsize=8)
def _weights_info(path: str, mtime: float, size: int) -> dict[str, Any]:
    return pretrained_info(path)


def pretrained_weights(cfg: ExperimentConfig, train: ImageSet | None) -> dict[str, Any] | None:
    """What the run starts from when ``model.kwargs.pretrained`` names a local
    checkpoint: its path, sha256, size and model card (``osfl pretrain``);
    with a card and the train set at hand, a task whose data the encoder may
    have seen (same source and a shared class, or the same images) is refused
    here, before anything trains. A ``hf-hub:`` id is recorded as given."""
    path = cfg.model.kwargs.get("pretrained")
    if not path:
        return None
    if str(path).startswith("hf-hub:"):
        return {"source": str(path)}
    p = Path(str(path))
    if not p.is_file():
        raise ConfigError(f"model.kwargs.pretrained: {str(p)!r} is not a file")
    stat = p.stat()
    info = _weights_info(str(p.resolve()), stat.st_mtime, stat.st_size)
    if info["card"] is not None and train is not None:
        check_disjoint(info["card"], cfg.data.source, train.classes, train.fingerprint())
    return info


def run_context(
    cfg: ExperimentConfig,
    *,
    image_shape: tuple[int, int, int],
    classes: tuple[str, ...],
    num_clients: int,
    seed: int,
    stats_from: ImageSet | None,
    progress: Progress | None = None,
    weights: Mapping[str, Any] | None = None,
) -> RunContext:
    """The RunContext of a task: ``stats_from`` is the set whose channel
    statistics normalise the inputs when ``transform.mean``/``std`` are not
    given (``None`` at real sites, where they must be); ``weights``: the
    pretrained checkpoint's info (:func:`pretrained_weights`)."""
    c, h, _ = image_shape
    kwargs = dict(cfg.model.kwargs)
    kwargs.setdefault("in_chans", c)
    kwargs.setdefault("img_size", h)
    if (weights or {}).get("card") is not None:  # its head scores the upstream classes
        kwargs.setdefault("pretrained_head", "fresh")
    train_tf, eval_tf = build_transforms(cfg, stats_from)
    return RunContext(
        num_classes=len(classes),
        image_shape=image_shape,
        num_clients=num_clients,
        model=ModelSpec(cfg.model.name, kwargs, (weights or {}).get("sha256")),
        train=cfg.train,
        train_transform=train_tf,
        eval_transform=eval_tf,
        seed=seed,
        device=resolve_device(cfg.device),
        cache=ClientCache(cfg.cache_dir) if cfg.cache_dir else None,
        progress=progress or Progress(),
        server=cfg.server,
        secagg=cfg.secagg,
        classes=tuple(classes),
    )


@dataclass
class SeedContext:
    """What one seed's runs share: data, federation, run context (a real-sites
    server has neither the data nor a federation: ``None``)."""

    splits: DataSplits | None
    federation: Federation | None
    run: RunContext


def seed_context(
    cfg: ExperimentConfig, splits: DataSplits, seed: int, progress: Progress | None = None
) -> SeedContext:
    fed = build_federation(cfg, splits.train, seed)
    return SeedContext(splits, fed, build_run(cfg, splits, fed, seed, progress))


# --------------------------------------------------------------------------- methods
def build_method(
    cfg: ExperimentConfig, name: str, run: RunContext, sizes: Sequence[int] | None = None
) -> Method:
    """Method ``name`` with its config from ``cfg.method[name]``, wrapped in the
    config's client-side ``defense`` (clipping + DP noise) when it has one, and
    in the ``byzantine`` poison of the clients it names or picks from their
    data ``sizes`` (outermost: a poisoned client does not run the defence
    honestly)."""
    cls = METHODS.get(name)
    rule = cfg.server.aggregator
    if rule != "mean" and not cls.card.server_rule:
        raise ConfigError(
            f"server.aggregator={rule!r} is a rule for combining clients' model weights, and "
            f"{name} does not combine weights with it; run {name} with server.aggregator=mean "
            "(its own defences, e.g. server.member_filter for an ensemble or "
            "method.fafi.fusion=median: docs/robustness.md)"
        )
    method = cls(method_config(cls, cfg.method.get(name, {})), run)
    return apply_byzantine(apply_defense(method, cfg.defense), cfg.byzantine, sizes)


def test_evaluator(test: ImageSet, run: RunContext) -> Callable[[Any], dict[str, Any]]:
    """Accuracy of a predictor on ``test`` (global and per class)."""

    def score(predictor: Any) -> dict[str, Any]:
        return evaluate(predictor, test, run.eval_transform, run.device).as_dict()

    return score


def build_evaluator(cfg: ExperimentConfig, ctx: SeedContext) -> Callable[[Any], dict[str, Any]]:
    """Test accuracy of a predictor (global, per class; per client's label mix
    with ``eval_local``)."""
    on_test = test_evaluator(ctx.splits.test, ctx.run)

    validation = ctx.splits.validation

    def score(predictor: Any) -> dict[str, Any]:
        test, run = ctx.splits.test, ctx.run
        res = on_test(predictor)
        if validation is not None:
            res["validation_accuracy"] = evaluate(
                predictor, validation, run.eval_transform, run.device
            ).accuracy
        if cfg.eval_local:
            accs = local_test_accuracy(
                predictor, test, ctx.federation.class_counts, run.eval_transform, run.device
            )
            res["local_test_accuracies"] = accs
            res["local_test_accuracy"] = float(sum(accs) / len(accs))
        return res

    return score


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


def method_run(cfg: ExperimentConfig, name: str, run: RunContext) -> RunContext:
    """``run`` with method ``name``'s local-training recipe (:func:`train_recipe`)."""
    train, _ = train_recipe(cfg, name)
    return run if train == run.train else dataclasses.replace(run, train=train)


def build_job(cfg: ExperimentConfig, name: str, ctx: SeedContext) -> Job:
    """Method ``name`` × the seed of ``ctx``, ready for a runtime."""
    run = method_run(cfg, name, ctx.run)
    method = build_method(cfg, name, run, [len(ix) for ix in ctx.federation.client_indices])
    give_validation(method, ctx.splits.validation)
    return Job(
        method=method,
        run=run,
        clients=PartitionedData(ctx.splits.train, ctx.federation),
        seed=ctx.run.seed,
        evaluator=build_evaluator(cfg, ctx),
        eval_every=cfg.eval_every,
    )


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
