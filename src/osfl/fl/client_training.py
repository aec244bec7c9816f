"""Cached client training: :func:`train_client` trains one client's model
through the run's content-keyed :class:`~osfl.fl.cache.ClientCache`.

Local training is the expensive part of one-shot FL that every method shares
(docs/design.md §2, §7): one-shot FedAvg, Ensemble, FedDF, DENSE, Co-Boosting,
DeepInversion/ADI and FedMITR all start from the same trained clients, so a
comparison of ten methods trains each client once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from osfl.fl.batched_training import batchable, train_batched
from osfl.fl.cache import state_hash, transform_key
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.provenance import compute_environment
from osfl.fl.train_config import TrainConfig
from osfl.fl.train_stats import TrainStats, stats_health
from osfl.fl.training import (
    LossFn,
    OnBatch,
    init_model,
    replay_step_labels,
    report_training_warnings,
    train_local,
)

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform
    from osfl.fl.context import ClientContext, SharedTraining

__all__ = ["train_client", "train_clients_together"]

log = logging.getLogger(__name__)


def train_client(
    ctx: ClientContext,
    data: ImageSet,
    *,
    model: nn.Module | None = None,
    cfg: TrainConfig | None = None,
    transform: Transform | None = None,
    terms: Sequence[ObjectiveTerm] = (),
    loss_fn: LossFn | None = None,
    objective: str = "ce",
    extra_key: Any = None,
    on_batch: OnBatch | None = None,
) -> nn.Module:
    """Train one client's model, through ``ctx.run.cache`` when it is set.

    Defaults come from the run: the model is :func:`init_model` (the common
    initial weights), the recipe ``ctx.run.train``, the augmentation
    ``ctx.run.train_transform``; the batch order and augmentations are seeded
    from ``ctx.seed_for("local-train")``. The cache key holds the data
    fingerprint, the model spec, the initial weights (their hash when ``model``
    is given, e.g. a broadcast global model), the config, the transform, the run
    seed, the client id, ``objective`` (name your ``loss_fn``), the terms'
    keys and ``extra_key``, but *not* the round: one-shot methods that all
    train in round 0 share the entry. ``on_batch`` must see real steps, so it
    bypasses the cache. The labels of every local step are stored with the
    entry, and a hit hands them to an active
    :func:`~osfl.fl.training.record_step_labels` block as if it had trained.
    Returns the model on ``ctx.device`` in eval mode.
    """
    run = ctx.run
    cfg = cfg if cfg is not None else run.train
    transform = transform if transform is not None else run.train_transform
    given = model is not None
    if model is None:
        model = init_model(run)
    model.to(ctx.device)

    step_labels: list[torch.Tensor] = []

    def fit(collect: OnBatch | None = on_batch) -> TrainStats:
        gen = torch.Generator().manual_seed(ctx.seed_for("local-train"))
        stats = train_local(
            model,
            data,
            cfg,
            transform=transform,
            device=ctx.device,
            generator=gen,
            terms=terms,
            loss_fn=loss_fn,
            progress=run.progress,
            description=f"client {ctx.client_id}: local training",
            on_batch=collect,
        )
        log.info(
            "client %d: %d steps, loss %.4f, %.1fs",
            ctx.client_id,
            stats.steps,
            stats.mean_loss,
            stats.seconds,
        )
        return stats

    if run.cache is None or on_batch is not None:
        fit()
        return model.eval()

    parts = cache_parts(
        ctx,
        data,
        model,
        cfg,
        transform,
        given=given,
        terms=terms,
        objective=objective,
        extra_key=extra_key,
    )
    cache = run.cache
    key = cache.key(**parts)
    state = cache.get(key, like=model.state_dict())
    if state is not None:
        model.load_state_dict(state)
        log.info("client %d: trained weights from the cache (%s)", ctx.client_id, key[:12])
        _replay_step_labels(cache.aux(key))
        stats = (cache.meta(key) or {}).get("stats") or {}
        report_training_warnings(stats_health(stats))
        return model.eval()
    stats = fit(lambda step, x, y: step_labels.append(y.detach()))
    aux = _step_label_aux(step_labels)
    cache.put(key, model.state_dict(), {"parts": parts, "stats": stats.as_dict()}, aux)
    return model.eval()


def cache_parts(
    ctx: ClientContext,
    data: ImageSet,
    model: nn.Module,
    cfg: TrainConfig,
    transform: Transform | None,
    *,
    given: bool = True,
    terms: Sequence[ObjectiveTerm] = (),
    objective: str = "ce",
    extra_key: Any = None,
) -> dict[str, Any]:
    """What a client-training cache entry is keyed on (see :func:`train_client`)."""
    run = ctx.run
    return {
        "kind": "client-train",
        "data": data.fingerprint(),
        "model": run.model.key(),
        "num_classes": run.num_classes,
        "init": state_hash(model.state_dict()) if given else "run-init",
        "train": asdict(cfg),
        "transform": transform_key(transform),
        "seed": run.seed,
        "client": ctx.client_id,
        "objective": objective,
        "terms": [t.key() for t in terms],
        "extra": extra_key,
        # weights trained under other threads, CPU kernels, torch or device differ
        # in the last bits: they are another entry, never a silent hit
        "environment": compute_environment(run.device),
    }


def _step_label_aux(step_labels: Sequence[torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The cache's record of what each local step used, so that a later hit can replay it."""
    if not step_labels:
        return None
    return {
        "step_labels": torch.cat(list(step_labels)).to("cpu", torch.int64),
        "step_sizes": torch.tensor([len(y) for y in step_labels], dtype=torch.int64),
    }


def _replay_step_labels(aux: Mapping[str, torch.Tensor] | None) -> None:
    """Feed a cache hit's stored step labels to an active ``record_step_labels`` block."""
    if aux is None or "step_labels" not in aux:
        return
    sizes = [int(n) for n in aux["step_sizes"]]
    replay_step_labels(list(torch.split(aux["step_labels"], sizes)))


def train_clients_together(
    plan: SharedTraining, clients: Mapping[int, tuple[ClientContext, ImageSet]]
) -> list[int]:
    """Train the clients the cache does not hold yet as one batched step
    (:mod:`osfl.fl.batched_training`) and store each result under the key
    :func:`train_client` will look up, so each client's own turn is a cache
    hit (with its step labels and warnings). Returns the clients trained; none
    when the run has no cache, fewer than two are missing, or
    :func:`~osfl.fl.batched_training.batchable` says no (logged): they then
    train one by one as usual."""
    if not clients:
        return []
    run = next(iter(clients.values()))[0].run
    if run.cache is None:
        return []
    cache, transform, cfg = run.cache, run.train_transform, plan.cfg
    if plan.select is not None:  # what each client's own turn trains on
        clients = {c: (ctx, plan.select(ctx, data)) for c, (ctx, data) in clients.items()}
    missing: dict[int, tuple[str, dict[str, Any]]] = {}
    for c, (ctx, data) in clients.items():
        parts = cache_parts(ctx, data, plan.model, cfg, transform)
        key = cache.key(**parts)
        if cache.meta(key) is None:
            missing[c] = (key, parts)
    why = batchable(plan.model, cfg, [len(clients[c][1]) for c in missing])
    if why is not None:
        if len(missing) > 1:
            log.info("clients train one by one: %s", why)
        return []
    order = sorted(missing)
    results = train_batched(
        plan.model,
        [clients[c][1] for c in order],
        cfg,
        [torch.Generator().manual_seed(clients[c][0].seed_for("local-train")) for c in order],
        transform=transform,
        device=clients[order[0]][0].device,
    )
    for c, result in zip(order, results, strict=True):
        key, parts = missing[c]
        log.info(
            "client %d: %d steps, loss %.4f (batched with %d clients)",
            c,
            result.stats.steps,
            result.stats.mean_loss,
            len(order),
        )
        for w in result.stats.warnings:
            log.warning("client %d: local training: %s", c, w)
        meta = {"parts": parts, "stats": result.stats.as_dict()}
        cache.put(key, result.state, meta, _step_label_aux(result.step_labels))
    return order
