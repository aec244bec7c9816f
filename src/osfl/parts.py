"""A run's parts, built from values the composition root read once.

:mod:`osfl.assembly` reads a configuration once into the plain requests
below (what to load, how to split it, which model, recipe, transforms and
device, which methods with which options and wrappers); the functions here
build the parts from those values alone — the data splits, each seed's
federation and run context, and each method's job — and never see the
configuration. So the route of a config value enters the composition root
once and then only goes down (docs/architecture.md, "The route of one config
value"), and every front end (``osfl run``, the Flower apps, ``osfl eval``,
the suite's preflight) builds a part the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from osfl.data.classes import keep_classes
from osfl.data.federation import Federation
from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.partition import make_federation
from osfl.data.saved_split import load_saved_split
from osfl.data.sources import load_data
from osfl.data.transforms import build_transform, channel_stats
from osfl.data.validation import carve_validation
from osfl.errors import ConfigError
from osfl.fl.cache import ClientCache
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.evaluate import Evaluator
from osfl.fl.method import Method, give_validation, rounds_of, secure_weighting_of
from osfl.fl.progress import Progress
from osfl.fl.runtime.base import Job, PartitionedData
from osfl.fl.secagg_config import SecAggPlusConfig, secure_refusal
from osfl.fl.seeds import derive_seed
from osfl.fl.server_config import ServerConfig
from osfl.fl.train_config import TrainConfig
from osfl.pretrain.card import check_disjoint, pretrained_info
from osfl.privacy.defenses import DefenseConfig, apply_defense
from osfl.robustness import ByzantineConfig, apply_byzantine


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DataRequest:
    """What to load: the source, its options (only those set), the classes to
    keep in that label order (``None``: all) and the validation share."""

    source: str
    options: Mapping[str, Any]
    classes: Sequence[str | int] | None = None
    validation_fraction: float = 0.0


def load_splits(req: DataRequest) -> DataSplits:
    """The train/test ImageSets of ``req``, restricted to its classes, with
    its validation share carved from the train set."""
    splits = load_data(req.source, **dict(req.options))
    splits = keep_classes(splits, req.classes, req.source) if req.classes else splits
    if not req.validation_fraction:
        return splits
    # seeded by the data alone: every run seed and every method holds out the same samples
    seed = derive_seed(0, "validation", splits.train.fingerprint())
    return carve_validation(splits, req.validation_fraction, seed)


@dataclass(frozen=True)
class FederationRequest:
    """How the clients split the train set: the scheme with its parameters,
    the pinned ``seed`` (``None``: each run seed's own), a saved split to load
    instead (``from_file``, checked against what was ``asked`` and the
    ``defaults``), and the JSON cache's folder."""

    scheme: str
    num_clients: int
    params: Mapping[str, Any]
    seed: int | None = None
    from_file: str | None = None
    asked: Mapping[str, Any] | None = None
    defaults: Sequence[Mapping[str, Any]] = ()
    cache_dir: str | None = None


def build_federation(req: FederationRequest, train: ImageSet, seed: int) -> Federation:
    """The clients' split of ``train`` for run seed ``seed``."""
    if req.from_file is not None:  # a saved split, the same for every seed
        return load_saved_split(
            req.from_file,
            train.labels,
            train.domains,
            req.num_clients,
            asked=req.asked,
            defaults=req.defaults,
        )
    return make_federation(
        train.labels,
        req.scheme,
        req.num_clients,
        req.seed if req.seed is not None else seed,
        domains=train.domains,
        num_classes=train.num_classes,
        cache_dir=req.cache_dir,
        **dict(req.params),
    )


# --------------------------------------------------------------------------- run context
@functools.lru_cache(maxsize=8)
def _weights_info(path: str, mtime: float, size: int) -> dict[str, Any]:
    return pretrained_info(path)


def pretrained_weights(
    path: str | None, data_source: str, train: ImageSet | None
) -> dict[str, Any] | None:
    """What the run starts from when ``path`` (``model.kwargs.pretrained``)
    names a local checkpoint: its path, sha256, size and model card (``osfl
    pretrain``); with a card and the train set at hand, a task whose data the
    encoder may have seen (same source and a shared class, or the same
    images) is refused here, before anything trains. A ``hf-hub:`` id is
    recorded as given."""
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
        check_disjoint(info["card"], data_source, train.classes, train.fingerprint())
    return info


@dataclass(frozen=True)
class RunRequest:
    """A run context's values: the model and its keyword arguments, the local
    training recipe, the named transform pipelines with the stated
    normalisation (``None``: the train set's channel statistics) and image
    size, the device, the cache folder and the server's public rules."""

    model: str
    model_kwargs: Mapping[str, Any]
    train: TrainConfig
    train_pipeline: str
    eval_pipeline: str
    normalisation: tuple[Any, Any] | None
    image_size: int | None
    device: torch.device
    cache_dir: str | None
    server: ServerConfig
    secagg: SecAggPlusConfig


def build_transforms(req: RunRequest, train: ImageSet | None) -> tuple[Any, Any]:
    """``(train, eval)`` batched transforms, normalised with the stated mean
    and std when given, else with the train set's channel statistics (what
    every party of a rehearsal computes the same way)."""
    if req.normalisation is not None:
        mean, std = req.normalisation
    elif train is not None:
        mean, std = channel_stats(train)
    else:  # real sites refuse this earlier (site_assembly.check_sites); any other caller here
        raise ConfigError(
            "transform.mean and transform.std are needed where no party holds the whole "
            "train set (real sites): set them, e.g. transform.mean=[0.5,0.5,0.5] "
            "transform.std=[0.25,0.25,0.25]"
        )
    size = train.image_shape[1] if train is not None else req.image_size
    return (
        build_transform(req.train_pipeline, image_size=size, mean=mean, std=std),
        build_transform(req.eval_pipeline, image_size=size, mean=mean, std=std),
    )


def run_context(
    req: RunRequest,
    *,
    image_shape: tuple[int, int, int],
    classes: Sequence[str],
    num_clients: int,
    seed: int,
    stats_from: ImageSet | None,
    progress: Progress | None = None,
    weights: Mapping[str, Any] | None = None,
) -> RunContext:
    """The RunContext of a task: ``stats_from`` is the set whose channel
    statistics normalise the inputs when no normalisation is stated (``None``
    at real sites, where it must be); ``weights``: the pretrained
    checkpoint's info (:func:`pretrained_weights`)."""
    c, h, _ = image_shape
    kwargs = dict(req.model_kwargs)
    kwargs.setdefault("in_chans", c)
    kwargs.setdefault("img_size", h)
    if (weights or {}).get("card") is not None:  # its head scores the upstream classes
        kwargs.setdefault("pretrained_head", "fresh")
    train_tf, eval_tf = build_transforms(req, stats_from)
    return RunContext(
        num_classes=len(classes),
        image_shape=image_shape,
        num_clients=num_clients,
        model=ModelSpec(req.model, kwargs, (weights or {}).get("sha256")),
        train=req.train,
        train_transform=train_tf,
        eval_transform=eval_tf,
        seed=seed,
        device=req.device,
        cache=ClientCache(req.cache_dir) if req.cache_dir else None,
        progress=progress or Progress(),
        server=req.server,
        secagg=req.secagg,
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
    splits: DataSplits,
    seed: int,
    federation: FederationRequest,
    run: RunRequest,
    weights: Mapping[str, Any] | None,
    progress: Progress | None = None,
) -> SeedContext:
    """One seed's federation and the RunContext every party of a rehearsal
    shares (the task read off the train set, transforms normalised with its
    statistics)."""
    train = splits.train
    fed = build_federation(federation, train, seed)
    ctx = run_context(
        run,
        image_shape=train.image_shape,
        classes=train.classes,
        num_clients=len(fed.client_indices),
        seed=seed,
        stats_from=train,
        progress=progress,
        weights=weights,
    )
    return SeedContext(splits, fed, ctx)


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MethodRequest:
    """One method of a run: its class and options, its local-training recipe
    and where each value of it that differs from ``train.*`` came from, and
    the client-side wrappers (``defense``; ``byzantine``, outermost)."""

    name: str
    cls: type[Method]
    config: Any
    train: TrainConfig
    train_sources: Mapping[str, str]
    defense: Mapping[str, Any] | DefenseConfig | None = None
    byzantine: Mapping[str, Any] | ByzantineConfig | None = None


def method_run(req: MethodRequest, run: RunContext) -> RunContext:
    """``run`` with the method's local-training recipe."""
    return run if req.train == run.train else dataclasses.replace(run, train=req.train)


def build_method(req: MethodRequest, run: RunContext, sizes: Sequence[int] | None = None) -> Method:
    """The method on ``run``, wrapped in its client-side defence (clipping +
    DP noise) when it has one, and in the Byzantine poison of the clients it
    names or picks from their data ``sizes`` (outermost: a poisoned client
    does not run the defence honestly)."""
    method = req.cls(req.config, run)
    return apply_byzantine(apply_defense(method, req.defense), req.byzantine, sizes)


def build_job(
    req: MethodRequest, ctx: SeedContext, *, eval_local: bool = False, eval_every: int = 0
) -> Job:
    """The method × the seed of ``ctx``, ready for a runtime; its evaluator
    scores on the test set (and the validation set when one is held out; per
    client's label mix with ``eval_local``)."""
    splits, fed = ctx.splits, ctx.federation
    assert splits is not None and fed is not None  # a rehearsal's seed holds both
    run = method_run(req, ctx.run)
    method = build_method(req, run, [len(ix) for ix in fed.client_indices])
    give_validation(method, splits.validation)
    local = fed.class_counts if eval_local else None
    evaluator = Evaluator(splits.test, run.eval_transform, run.device, splits.validation, local)
    return Job(
        method=method,
        run=run,
        clients=PartitionedData(splits.train, fed),
        seed=ctx.run.seed,
        evaluator=evaluator,
        eval_every=eval_every,
    )


def check_jobs(
    jobs: Sequence[Job], *, train_clients: int | None, secagg: bool, server: ServerConfig
) -> None:
    """Each method's own ``check``, and what the run asks of every method
    (``train_clients``: one round; ``secagg``: a mean SecAgg+ can serve),
    before the first client trains."""
    for job in jobs:
        job.method.check()
        if train_clients is not None and rounds_of(job.method) != 1:
            raise ConfigError(
                f"train_clients trains one-shot clients; {job.method.name} runs "
                f"{rounds_of(job.method)} rounds"
            )
        if secagg:  # every method, before the first one trains
            why = secure_refusal(job.method.name, secure_weighting_of(job.method), server)
            if why is not None:
                raise ConfigError(f"secure aggregation: {why}")
