"""A run's parts built from read values (``osfl.parts``): the builders never
see the config, ``assembly.read_config`` reads it once into their requests,
and what they build from those requests is what the one-part front ends
(``assembly.load_splits``, ``build_job``, ...) build: the same data, the same
federation, the same wrapped methods with the same recipe."""

from __future__ import annotations

import ast
import dataclasses

import numpy as np
import pytest

from osfl import assembly, parts
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.privacy.defenses import DefendedMethod
from osfl.robustness.byzantine import ByzantineMethod
from support.paths import ROOT
from support.tiny import TINY


def test_the_builders_never_import_the_config() -> None:
    """The point of the module: it takes plain values, so no name from
    ``osfl.config`` (nor ``ExperimentConfig``) appears in it."""
    tree = ast.parse((ROOT / "src" / "osfl" / "parts.py").read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    ]
    assert imported and not [m for m in imported if m.startswith("osfl.config")]
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "ExperimentConfig" not in names


@pytest.fixture(scope="module")
def tiny() -> tuple:
    cfg = load_config(
        None,
        [
            *TINY,
            "methods=[fedavg,ensemble]",
            "method_train.ensemble.lr=0.01",
            "data.validation_fraction=0.2",
            "defense.clip=1.0",
            "byzantine.clients=[0]",
            "seeds=[0,1]",
        ],
    )
    return cfg, assembly.read_config(cfg)


def test_read_config_reads_each_part_once(tiny) -> None:
    cfg, r = tiny
    assert [m.name for m in r.methods] == ["fedavg", "ensemble"]
    ensemble = r.methods[1]
    assert ensemble.train.lr == 0.01 and ensemble.train_sources == {"lr": "method_train.ensemble"}
    assert r.methods[0].train == cfg.train and r.methods[0].train_sources == {}
    assert r.data.source == cfg.data.source and r.data.validation_fraction == 0.2
    assert r.federation.num_clients == cfg.partition.num_clients
    assert r.federation.from_file is None and r.federation.asked is None
    assert isinstance(r.cfg.parallel_clients, int)  # "auto" resolved to a count


def test_the_plan_is_built_from_the_reading(tiny) -> None:
    """Splits, federations and jobs of ``build_plan`` equal the one-part
    forms'; the validation share is carved from the train set, the same for
    both seeds; each method is wrapped, Byzantine outermost."""
    cfg, r = tiny
    whole = assembly.load_splits(
        dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, validation_fraction=0.0))
    )
    plan = assembly.build_plan(cfg)
    splits = plan.splits
    assert splits is not None and splits.validation is not None
    assert len(splits.train) + len(splits.validation) == len(whole.train)
    assert len(plan.seeds) == 2
    for (ctx, jobs), seed in zip(plan.seeds, cfg.seeds, strict=True):
        fed = assembly.build_federation(cfg, splits.train, seed)
        assert [list(ix) for ix in ctx.federation.client_indices] == [
            list(ix) for ix in fed.client_indices
        ]
        assert ctx.run.seed == seed
        for job, m in zip(jobs, r.methods, strict=True):
            assert isinstance(job.method, ByzantineMethod)
            assert isinstance(job.method.inner, DefendedMethod)
            assert job.run.train == m.train
            one = assembly.build_job(cfg, m.name, ctx)
            assert one.run.train == job.run.train and type(one.method) is type(job.method)
    (ctx0, _), (ctx1, _) = plan.seeds
    assert any(  # each run seed its own split
        not np.array_equal(a, b)
        for a, b in zip(ctx0.federation.client_indices, ctx1.federation.client_indices, strict=True)
    )


def test_a_pinned_partition_seed_is_one_split_for_every_run_seed(tiny) -> None:
    _, r = tiny
    train = parts.load_splits(r.data).train
    pinned = dataclasses.replace(r.federation, seed=7)
    a, b = parts.build_federation(pinned, train, 0), parts.build_federation(pinned, train, 1)
    assert [list(ix) for ix in a.client_indices] == [list(ix) for ix in b.client_indices]
    c = parts.build_federation(r.federation, train, 7)
    assert [list(ix) for ix in a.client_indices] == [list(ix) for ix in c.client_indices]


def test_no_wrapper_where_none_is_asked(tiny) -> None:
    cfg, r = tiny
    plain = dataclasses.replace(r.methods[0], defense=None, byzantine=None)
    ctx = assembly.build_plan(cfg).seeds[0][0]
    job = parts.build_job(plain, ctx)
    assert type(job.method).__name__ == "FedAvg"


def test_check_jobs_refuses_a_multi_round_method_for_train_clients() -> None:
    cfg = load_config(
        None, [*TINY, "methods=[fedavg]", "method.fedavg.rounds=2", "train_clients=[0]"]
    )
    with pytest.raises(ConfigError, match="train_clients trains one-shot clients"):
        assembly.build_plan(cfg)
