"""Jobs for real sites (``sites = true`` in Flower's run config): each site
builds its job from the config and its own data, the server from the config
alone (and, optionally, its own test set).

What every party must agree on comes from the config, never from data only
one of them holds: the class names (``data.classes``), the image shape
(``data.image_size``, ``data.channels``), the normalisation
(``transform.mean``/``std``) and the number of sites
(``partition.num_clients``). Those go into the job digest, so a site whose
config differs is refused at discovery; a site whose folders hold a class
outside ``data.classes`` is refused when it loads its data, with the class
named. See :mod:`osfl.fl.runtime.sites`.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

from osfl import assembly
from osfl.config import ExperimentConfig
from osfl.data.imageset import DataSplits
from osfl.errors import ConfigError
from osfl.fl.context import RunContext
from osfl.fl.method import SiteEvaluation, capability
from osfl.fl.progress import Progress
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.sites import NoClientData, SiteData, SiteRegistry, align_classes

__all__ = ["check_sites", "job_for_spec", "site_client_job", "site_run", "site_server_job"]


def check_sites(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The agreed class names, after refusing what a sites run cannot do."""
    d = cfg.data
    missing = [
        key
        for key, value in (
            ("data.classes", d.classes),
            ("data.image_size", d.image_size),
            ("data.channels", d.channels),
            ("transform.mean", cfg.transform.mean),
            ("transform.std", cfg.transform.std),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"a sites run needs {', '.join(missing)} in the config: every party must agree on "
            "them without seeing the others' data (docs/flower.md, 'Real sites')"
        )
    if len(set(d.classes or ())) != len(d.classes or ()) or len(d.classes or ()) < 2:
        raise ConfigError("data.classes must name at least two distinct classes")
    if cfg.audit:
        raise ConfigError(
            "privacy audits need the clients' ground truth, which real sites keep: "
            "audit a rehearsal (sites = false) instead"
        )
    if cfg.eval_local:
        raise ConfigError("eval_local needs the clients' label mixes, which real sites keep")
    return tuple(d.classes or ())


def site_run(cfg: ExperimentConfig, seed: int, progress: Progress | None = None) -> RunContext:
    """The RunContext of a sites run: the same on the server and every site."""
    classes = check_sites(cfg)
    size = int(cfg.data.image_size or 0)
    return assembly.run_context(
        cfg,
        image_shape=(int(cfg.data.channels or 0), size, size),
        classes=classes,
        num_clients=cfg.partition.num_clients,
        seed=seed,
        stats_from=None,
        progress=progress,
        weights=assembly.pretrained_weights(cfg, None),
    )


def _load(cfg: ExperimentConfig, spec: str, classes: tuple[str, ...], where: str) -> DataSplits:
    """``spec`` loaded with the config's image options, relabelled onto ``classes``."""
    # all of the site's classes are loaded, so that a foreign one is refused, not dropped
    data_cfg = replace(cfg, data=replace(cfg.data, source=spec, classes=None))
    return align_classes(assembly.load_splits(data_cfg), classes, where)


def site_client_job(
    cfg: ExperimentConfig, name: str, seed: int, client: int, data: str, test_data: str = ""
) -> Job:
    """Site ``client``'s job: its own train data (``data``) and test data
    (``test_data``, default the test split of ``data``)."""
    run = assembly.method_run(cfg, name, site_run(cfg, seed))
    own = _load(cfg, data, run.classes, f"site {client} data {data!r}")
    test = (
        _load(cfg, test_data, run.classes, f"site {client} test data").test
        if test_data
        else own.test
    )
    if own.train.image_shape != run.image_shape:
        raise ConfigError(
            f"site {client}: its images are {own.train.image_shape}, the job's {run.image_shape}"
        )
    return Job(
        method=assembly.build_method(cfg, name, run),
        run=run,
        clients=SiteData(client, cfg.partition.num_clients, own.train, test),
        seed=seed,
    )


def site_server_job(
    cfg: ExperimentConfig,
    name: str,
    seed: int,
    server_test: str = "",
    progress: Progress | None = None,
    registry: SiteRegistry | None = None,
) -> Job:
    """The server's job: no client data; evaluation on ``server_test`` when
    given, else at the sites (the method must be able to release its model).
    ``registry``: which node plays each site and its declared size (no
    larger than ``server.max_num_samples``). Its run holds the server's own
    random ``server_secret``, drawn here and sent nowhere: the sites cannot
    know the server rule's random draws (DnC's coordinates)."""
    run = assembly.method_run(cfg, name, site_run(cfg, seed, progress))
    run = replace(run, server_secret=secrets.token_hex(32))
    method = assembly.build_method(cfg, name, run)
    evaluator: Any = None
    if server_test:
        test = _load(cfg, server_test, run.classes, f"server test data {server_test!r}").test
        evaluator = assembly.test_evaluator(test, run)
    elif capability(method, SiteEvaluation) is None:
        raise ConfigError(
            f"{name} cannot send its final model to the sites for evaluation without "
            "revealing what it learnt about individual clients; give the server a test "
            "set (run config 'server-test')"
        )
    return Job(
        method=method,
        run=run,
        clients=NoClientData(cfg.partition.num_clients, registry, cfg.server.max_num_samples),
        seed=seed,
        evaluator=evaluator,
        eval_every=cfg.eval_every if server_test else 0,
        evaluate_at_clients=not server_test,
    )


def job_for_spec(spec: Any) -> Job:
    """The job a Flower process builds from its spec: a rehearsal's
    (:func:`osfl.assembly.job_from_spec`) or a site's (its node's data)."""
    if not spec.sites:
        return assembly.job_from_spec(spec)
    cfg, name, seed = assembly.load_experiment(spec)
    node = dict(spec.node)
    if "data" not in node or "partition-id" not in node:
        raise ConfigError(
            "this SuperNode of a sites run lacks node config 'partition-id' or 'data': start "
            "it with flower-supernode --node-config 'partition-id=<i> data=\"<source spec>\"'"
        )
    try:
        client = int(node["partition-id"])
    except ValueError as e:
        raise ConfigError(
            f"node config partition-id must be an integer, got {node['partition-id']!r}"
        ) from e
    return site_client_job(cfg, name, seed, client, node["data"], node.get("test-data", ""))
