"""The composition root (``osfl.assembly``): the experiment a Flower job names
(``load_experiment``: YAML text or a file, a missing file or unknown method
refused), the method names checked before any training (``check_names``), and
a method's local-training recipe (``train_recipe``): one source per value, resolved once by the
assembly (``train.*`` < the method's ``card.train_defaults`` < ``method_train.<name>.*``),
the same for every config as before the per-method copies of ``train.*`` went, and
recorded with where each value came from."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from osfl.assembly import (
    Plan,
    build_plan,
    check_names,
    load_experiment,
    method_names,
    train_recipe,
)
from osfl.cli import main
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.fl.evaluate import Evaluator
from osfl.fl.method import METHODS
from osfl.fl.train_config import TrainConfig
from osfl.flower.spec import JobSpec
from support.paths import ROOT
from support.tiny import TINY

CONFIGS = ROOT / "configs"


def test_override_applies_to_its_method_only(tmp_path):
    cfg = load_config(
        None,
        [
            *TINY,
            "methods=[fedavg,ensemble]",
            "train.lr=0.05",
            "method_train.ensemble.lr=0.01",
            "method_train.ensemble.epochs=2",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    assert train_recipe(cfg, "fedavg") == (cfg.train, {})
    ens, sources = train_recipe(cfg, "ensemble")
    assert (ens.lr, ens.epochs, ens.batch_size) == (0.01, 2, cfg.train.batch_size)
    # epochs=2 is train.epochs already (TINY): only the value that differs has a source
    assert cfg.train.epochs == 2 and sources == {"lr": "method_train.ensemble"}
    recs = {r["method"]: r for r in run_experiment(cfg)}
    assert recs["fedavg"]["train"]["lr"] == 0.05 and recs["ensemble"]["train"]["lr"] == 0.01
    assert recs["ensemble"]["train"]["epochs"] == 2
    assert recs["fedavg"]["train_sources"] == {}
    assert recs["ensemble"]["train_sources"] == {"lr": "method_train.ensemble"}
    # another recipe is another client training: the ensemble did not reuse FedAvg's clients
    assert recs["ensemble"]["cache"]["misses"] == cfg.partition.num_clients


def test_precedence_run_then_method_default_then_user():
    base = ["train.grad_clip=3.0", "train.lr=0.02"]
    cfg = load_config(None, base)
    # the method's default beats the run's recipe ...
    assert train_recipe(cfg, "fafi_code") == (
        dataclasses.replace(cfg.train, grad_clip=1.0),
        {"grad_clip": "fafi_code default"},
    )
    assert train_recipe(cfg, "fafi") == (cfg.train, {})
    # ... and the user's method_train beats both
    user = load_config(None, [*base, "method_train.fafi_code.grad_clip=0.5"])
    train, sources = train_recipe(user, "fafi_code")
    assert (train.grad_clip, train.lr) == (0.5, 0.02)
    assert sources == {"grad_clip": "method_train.fafi_code"}


def test_every_methods_recipe_defaults_are_recipe_keys():
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in METHODS.names():
        unknown = sorted(set(METHODS.get(name).card.train_defaults) - keys)
        assert not unknown, f"method {name!r}: card.train_defaults {unknown} are not train.* keys"


def _old_recipe(train: TrainConfig, **changes: object) -> TrainConfig:
    return dataclasses.replace(train, **changes)


#: (config, method) -> what the method trained with when its recipe lived in its own
#: options: FedAvg's `local_epochs` (epochs, steps=None), FAFI's `grad_clip` default.
OLD_RECIPES = {
    ("baselines_digits.yaml", "fedavg"): {"epochs": 2, "steps": None},
    ("baselines_digits.yaml", "fedprox"): {"epochs": 2, "steps": None},
    ("fafi_cifar10_cpu.yaml", "fafi_code"): {"grad_clip": 1.0},
    ("scoreboard_scratch_cpu.yaml", "fafi_code"): {"grad_clip": 1.0},
    ("default.yaml", "fafi_code"): {"grad_clip": 1.0},
}


def _run_configs() -> list[Path]:
    """The configs of ``osfl run`` (the others belong to ``osfl pretrain`` and
    benchmark scripts)."""
    out = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        try:
            load_config(path)
        except ConfigError:
            continue
        out.append(path)
    return out


def test_every_config_trains_with_its_old_recipe():
    """For every run config and method in it (and every registered method under
    the default config), the resolved recipe is the one it trained with before:
    client-cache keys and documented numbers stay as they were."""
    checked = set()
    for path in _run_configs():
        cfg = load_config(path, ["sweep=[]"])
        names = method_names(cfg)
        if path.name == "default.yaml":
            names = METHODS.names()
        for name in names:
            changes = OLD_RECIPES.get((path.name, name), {})
            assert train_recipe(cfg, name)[0] == _old_recipe(cfg.train, **changes), (path, name)
            checked.add((path.name, name))
    assert set(OLD_RECIPES) <= checked


@pytest.mark.parametrize(
    ("override", "new_key"),
    [
        ("method.fafi.lr=0.01", "method_train.fafi.lr"),
        ("method.fafi.grad_clip=1.0", "method_train.fafi.grad_clip"),
        ("method.fafi.local_epochs=5", "method_train.fafi.epochs"),
        ("method.fafi_code.grad_clip=1.0", "method_train.fafi_code.grad_clip"),
        ("method.fedavg.local_epochs=5", "method_train.fedavg.epochs"),
        ("method.fedprox.local_epochs=2", "method_train.fedprox.epochs"),
        ("method.fedlora.local_epochs=2", "method_train.fedlora.epochs"),
        ("method.scaffold.local_epochs=2", "method_train.scaffold.epochs"),
        ("method.eftvit.local_epochs=2", "method_train.eftvit.epochs"),
        ("method.fusefl.epochs_per_step=5", "method_train.fusefl.epochs"),
        ("method.fafi.tau=0.3", "method.fafi.loss.tau"),
        ("method.fafi.noise_std=5", "method.fafi.noise.std"),
        # FitConfig's mixed precision took train.amp's name (was autocast: bfloat16|none)
        ("method.falcon.generator_fit.autocast=bfloat16", "method.falcon.generator_fit.amp"),
        # a method without the recipe: its own optimizer group, not method_train
        ("method.falcon.lr=0.1", "method.falcon.generator_fit.lr"),
    ],
)
def test_an_old_key_is_refused_naming_the_new_one(override, new_key, capsys, tmp_path, monkeypatch):
    cfg = load_config(None, [override])
    with pytest.raises(ConfigError, match=f"write {re.escape(new_key)}="):
        check_names(cfg)
    monkeypatch.chdir(tmp_path)
    # on the command line: one line, exit status 2, nothing trains
    with pytest.raises(SystemExit) as e:
        main(["run", override, "progress=false"])
    assert e.value.code == 2
    assert new_key in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, needle",
    [
        (
            "method_train.fedavg.lrr=0.1",
            r"unknown option 'lrr' \(did you mean 'lr'\?\) in method_train",
        ),
        ("method_train.nosuch.lr=0.1", "nosuch"),
        ("method_train.fedavg.lr=fast", "method_train.fedavg"),
    ],
)
def test_bad_overrides_are_refused_before_training(override, needle):
    cfg = load_config(None, [*TINY, "methods=[fedavg]", override])
    with pytest.raises(ConfigError, match=needle):
        check_names(cfg)


def test_method_train_of_a_method_without_the_recipe_exits_2_naming_its_knobs(capsys, tmp_path):
    """FALCON never reads ``run.train``: ``method_train.falcon.lr`` would be recorded
    in ``train_sources`` and ignored, so ``osfl run`` refuses it in one line that
    names FALCON's own training groups (its ``FitConfig`` fields)."""
    with pytest.raises(SystemExit) as e:
        main(["run", "methods=[falcon]", "method_train.falcon.lr=0.5", f"out_dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "method_train.falcon does not apply" in err
    assert "method.falcon.generator_fit.*" in err and "method.falcon.classifier_fit.*" in err


def test_a_method_without_the_recipe_records_no_train_sources():
    cfg = load_config(None, ["train.lr=0.3"])
    assert train_recipe(cfg, "falcon") == (cfg.train, {})


def test_load_experiment_reads_yaml_text_and_refuses_missing_files(tmp_path: Path) -> None:
    cfg, name, seed = load_experiment(
        JobSpec(experiment="methods: [ensemble]\nseeds: [7, 8]\n", overrides=("train.epochs=2",))
    )
    assert (name, seed, cfg.train.epochs) == ("ensemble", 7, 2)
    path = tmp_path / "c.yaml"
    path.write_text("methods: [fedavg]\n")
    assert load_experiment(JobSpec(experiment=str(path), seed=2))[1:] == ("fedavg", 2)
    with pytest.raises(ConfigError, match="neither an existing YAML file nor YAML text"):
        load_experiment(JobSpec(experiment=str(tmp_path / "missing.yaml")))
    with pytest.raises(ConfigError, match="unknown method"):
        load_experiment(JobSpec(method="nope"))


def test_build_plan_builds_every_seeds_checked_jobs_in_one_call(tmp_path):
    """``build_plan`` is the one entry: per seed a federation, a run context
    and one job per method, each job's evaluator built from the seed's parts
    (its federation's class counts only with ``eval_local``), and the
    config with ``parallel_clients`` resolved to a count."""

    over = [*TINY, "methods=[local,fedavg]", "seeds=[0,1]", f"cache_dir={tmp_path}"]
    plan = build_plan(load_config(None, [*over, "eval_local=true"]))
    assert isinstance(plan, Plan) and isinstance(plan.cfg.parallel_clients, int)
    assert [[j.method.name for j in jobs] for _, jobs in plan.seeds] == [["local", "fedavg"]] * 2
    for ctx, jobs in plan.seeds:
        assert {j.seed for j in jobs} == {ctx.run.seed}
        for job in jobs:
            assert isinstance(job.evaluator, Evaluator)
            assert job.evaluator.test is plan.splits.test
            assert np.array_equal(job.evaluator.local_counts, ctx.federation.class_counts)
    plain = build_plan(load_config(None, over))
    assert all(j.evaluator.local_counts is None for _, js in plain.seeds for j in js)


def test_build_plan_refuses_a_multi_round_method_for_train_clients(tmp_path):
    over = [*TINY, "methods=[fedavg]", "method.fedavg={rounds: 3}", f"cache_dir={tmp_path}"]
    over.append("train_clients=[0]")
    with pytest.raises(ConfigError, match="train_clients trains one-shot clients; fedavg"):
        build_plan(load_config(None, over))
