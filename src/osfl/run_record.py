"""The builder of the run record (:class:`osfl.record.RunRecord`) of one
finished job: what ``osfl run`` and the Flower apps write to ``metrics.json``
(schema: ``docs/run-directory.md``).

Apart from :mod:`osfl.assembly` (the composition root that builds the job)
because the record is a format of its own: one builder, one type, and the
pieces a record is made of (provenance, the accuracy curve, the round chosen
on validation, the privacy audit whose scores are its ``audit``). It reads
the assembly's resolved parts (the training recipe, the pretrained weights);
the assembly does not import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.assembly import SeedContext, pretrained_weights, train_recipe
from osfl.config import ExperimentConfig
from osfl.convergence import convergence
from osfl.fl.method import Reporting, capability
from osfl.fl.provenance import compute_dtype, compute_environment
from osfl.fl.regimes import run_regime
from osfl.fl.runtime.base import Job, RunResult
from osfl.privacy.audit import AuditSession, parse_audit
from osfl.record import RunRecord
from osfl.robustness import poisoned_by


def run_record(
    cfg: ExperimentConfig,
    job: Job,
    result: RunResult,
    ctx: SeedContext,
    context: Mapping[str, Any],
    cache_counts: tuple[int, int] | None,
) -> RunRecord:
    """The ``metrics.json`` record of one finished job (schema in
    ``docs/run-directory.md``); ``cache_counts`` = (hits, misses) of this job."""
    weights = pretrained_weights(cfg, None)
    record: dict[str, Any] = {
        **context,
        # what the numbers presuppose: tables never rank records of different regimes together
        "regime": run_regime(job.method.card.regime, weights is not None),
        "uploads": job.method.card.uploads,
        "runtime": cfg.runtime,
        # torch threads each client trained with (null: not pinned)
        "threads_per_client": cfg.threads_per_client,
        "parallel_clients": cfg.parallel_clients,
        # what the numbers were computed with (the client cache is keyed on the same)
        "provenance": record_provenance(cfg, job, ctx, weights),
        # the task this grid point ran (data, model, transforms): what a table row
        # averaged over seeds must share (osfl.scoreboard)
        "task": {
            "data": {k: v for k, v in dataclasses.asdict(cfg.data).items() if k != "cache_dir"},
            "model": dataclasses.asdict(cfg.model),
            "transform": dataclasses.asdict(cfg.transform),
        },
        "method_config": dataclasses.asdict(job.method.config),
        # the local-training recipe this method ran with (train_recipe), and
        # where each value that differs from train.* came from; none for a
        # method that does not train with it (FALCON, FedPFT, ...: their own
        # optimizer groups are in method_config)
        **recipe_block(cfg, job),
        "rounds": len(result.rounds),
        **result_metrics(cfg, job, result),
        "bytes_up": result.bytes_up,
        "bytes_down": result.bytes_down,
        "time_s": {k: round(v, 4) for k, v in result.time_s.items()},
        "server_rules": dataclasses.asdict(cfg.server),
        "partition": partition_block(ctx, job),
        "cache": {
            "hits": cache_counts[0] if cache_counts else None,
            "misses": cache_counts[1] if cache_counts else None,
        },
        "refused": [list(x) for x in result.refused],
        "curve": accuracy_curve(result),
    }
    reached = convergence(
        record["curve"], target_accuracy=cfg.target_accuracy, link_mbps=cfg.link_mbps
    )
    if reached is not None:
        record["convergence"] = reached
    chosen = best_on_validation(record["curve"])
    if chosen is not None and len(record["curve"]) > 1:
        record["best_on_validation"] = chosen
    if weights is not None:
        record["pretrained"] = pretrained_block(weights)
    reporting = capability(job.method, Reporting)
    # no state when only some clients trained (train_clients): nothing to report
    extras = reporting.report(result.state) if reporting and result.state is not None else {}
    if extras:
        record["server"] = extras
    return RunRecord.from_dict(record)


def result_metrics(cfg: ExperimentConfig, job: Job, result: RunResult) -> dict[str, Any]:
    """The runtime's final metrics, under the names the runtime gave them
    (the server predictor's plain, the clients' own models' named for them:
    :mod:`osfl.fl.own_models`), with the run's warnings, its client-side
    ``defense`` and ``byzantine`` poison."""
    m = dict(result.metrics)
    m["warnings"] = list(dict.fromkeys(result.warnings))
    if cfg.defense:
        m["defense"] = dict(cfg.defense)
    poison = poisoned_by(job.method)
    if poison is not None:  # the clients it chose this seed, not only how it chose them
        chosen = {k: v for k, v in dict(cfg.byzantine).items() if k != "clients"}
        m["byzantine"] = {**dataclasses.asdict(poison), **chosen}
    return m


def partition_block(ctx: SeedContext, job: Job) -> dict[str, Any]:
    """The record's ``partition``: the split's key, scheme, parameters, seed and
    client count (real sites: only ``sites`` and the count)."""
    fed = ctx.federation
    if fed is None:
        return {"scheme": "sites", "num_clients": job.num_clients}
    return {
        "key": fed.key(),
        "scheme": fed.scheme,
        "params": dict(fed.params),
        "seed": fed.seed,
        "num_clients": len(fed.client_indices),
    }


def recipe_block(cfg: ExperimentConfig, job: Job) -> dict[str, Any]:
    """``train`` and ``train_sources`` for a method that trains with the
    shared recipe; nothing for one that does not (a recipe it never read
    would be compared by the scoreboard as if it had)."""
    if not job.method.trains_with_recipe:
        return {}
    return {
        "train": dataclasses.asdict(job.run.train),
        "train_sources": train_recipe(cfg, job.method.name)[1],
    }


def pretrained_block(weights: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``pretrained``: the checkpoint's path, sha256 and size, and
    from its card the upstream data and the pretraining objective."""
    card = weights.get("card") or {}
    return {
        **{k: v for k, v in weights.items() if k != "card"},
        "upstream": {k: card["upstream"].get(k) for k in ("source", "classes")}
        if "upstream" in card
        else None,
        "objective": (card.get("objective") or {}).get("name"),
    }


def build_audit(
    cfg: ExperimentConfig,
    job: Job,
    ctx: SeedContext,
    root: Path | None,
    context: Mapping[str, Any],
) -> Any:
    """The privacy audit of one run when ``cfg.audit`` lists attacks or
    ``record`` (an observer to attach, then ``finish()``: the record's
    ``audit``), else ``None``."""
    spec = parse_audit(cfg.audit)
    if spec is None:
        return None
    return AuditSession(spec, job.method, job.run, ctx.splits.test, root=root, context=context)


def record_provenance(
    cfg: ExperimentConfig, job: Job, ctx: SeedContext, weights: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The environment the clients trained in (torch, CPU kernel path,
    device, on a GPU its name, driver and torch build; the threads are
    ``threads_per_client``), the dtype local training computed in (``dtype``:
    ``bfloat16`` / ``float16`` under ``train.amp`` on a GPU, else
    ``float32``), and fingerprints of the
    data (content hashes of the train and test images the server held; a
    real-sites server holds none) and of the pretrained weights."""
    env = {k: v for k, v in compute_environment(job.run.device).items() if k != "threads"}
    splits = ctx.splits
    data: dict[str, Any] = {"source": cfg.data.source}
    if splits is not None:
        data.update(train=splits.train.fingerprint(), test=splits.test.fingerprint())
    return {
        **env,
        "dtype": compute_dtype(job.run.device, job.run.train.amp),
        "threads_per_client": cfg.threads_per_client,
        "data": data,
        "pretrained_sha256": (weights or {}).get("sha256"),
    }


#: The accuracies a curve point carries where the round's metrics hold them.
CURVE_ACCURACIES = (
    "mean_client_accuracy",
    "validation_accuracy",
    "mean_client_validation_accuracy",
)


def accuracy_curve(result: RunResult) -> list[dict[str, Any]]:
    """Each evaluated round's accuracies under the names its metrics (and the
    record) give them: ``global_test_accuracy`` (the server predictor's; null
    for ``local``), and where measured ``mean_client_accuracy`` and the
    validation accuracies; with the bytes (up + down) and compute seconds
    (client + server) spent up to the end of that round."""
    curve, sent, seconds = [], 0, 0.0
    for r in result.rounds:
        sent += r.bytes_up + r.bytes_down
        seconds += r.time_client_s + r.time_server_s
        if "global_test_accuracy" in r.metrics:
            point = {"round": r.round, "global_test_accuracy": r.metrics["global_test_accuracy"]}
            if "mean_client_accuracy" in r.metrics:
                point["mean_client_accuracy"] = r.metrics["mean_client_accuracy"]
            point.update(bytes=sent, seconds=round(seconds, 4))
            point.update({k: r.metrics[k] for k in CURVE_ACCURACIES[1:] if k in r.metrics})
            curve.append(point)
    return curve


def best_on_validation(curve: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The evaluated round with the highest validation accuracy (the first of
    equals) and its test accuracy: what a curve that jumps reports beside its
    final round, chosen without looking at the test set. Where the clients
    keep models of their own (``local``, EFTViT), their mean
    (``mean_client_validation_accuracy``, ``mean_client_accuracy``: what
    their papers evaluate, and what this chose before the names were split);
    otherwise the server predictor's (``validation_accuracy``,
    ``global_test_accuracy``). The keys say which."""
    for val, test in (
        ("mean_client_validation_accuracy", "mean_client_accuracy"),
        ("validation_accuracy", "global_test_accuracy"),
    ):
        scored = [p for p in curve if p.get(val) is not None]
        if scored:
            best = max(scored, key=lambda p: p[val])
            return {"round": best["round"], val: best[val], test: best[test]}
    return None
