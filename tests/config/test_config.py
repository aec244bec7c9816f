"""Structured configs: layering, validation messages, method overrides, sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfl.config import (
    ExperimentConfig,
    default_config_text,
    expand_sweeps,
    load_config,
    merge_sweeps,
    method_config,
    sweep_label,
    to_dict,
    to_yaml,
)
from osfl.errors import ConfigError
from osfl.fl.train_config import TrainConfig
from osfl.methods.ensemble import Ensemble
from osfl.methods.falcon import FALCON
from osfl.methods.fedavg import FedAvg, FedProx
from support.paths import ROOT

REPO = ROOT


def test_embedded_default_matches_repo_copy_and_loads():
    assert (REPO / "configs" / "default.yaml").read_text() == default_config_text()
    cfg = load_config()
    assert isinstance(cfg, ExperimentConfig) and isinstance(cfg.train, TrainConfig)
    assert cfg.data.source == "digits" and cfg.partition.scheme == "dirichlet"
    assert cfg.partition.alpha == 0.1 and cfg.partition.num_clients == 5
    assert cfg.model.name == "cnn_small" and cfg.methods == []


@pytest.mark.parametrize("name", ["default", "baselines_digits", "sweep_alpha_digits"])
def test_repo_configs_load(name):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    assert isinstance(cfg, ExperimentConfig) and cfg.scale == "cpu"


def test_layers_yaml_then_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\ntrain:\n  lr: 0.2\n  epochs: 3\npartition:\n  alpha: 0.5\n")
    cfg = load_config(path, ["train.lr=0.01", "seeds=[1,2,3]", "method.fedavg.rounds=5"])
    assert cfg.name == "exp"
    assert cfg.train.lr == 0.01 and cfg.train.epochs == 3  # override beats YAML, YAML kept
    assert cfg.partition.alpha == 0.5 and cfg.seeds == [1, 2, 3]
    # a file naming no base layers on the packaged default (its batch size and
    # its FAFI option come along); `base: none` stands on the dataclass defaults
    default = load_config(None)
    assert cfg.method == {**default.method, "fedavg": {"rounds": 5}}
    assert cfg.train.batch_size == default.train.batch_size != TrainConfig().batch_size
    path.write_text("base: none\n" + path.read_text())
    bare = load_config(path, ["method.fedavg.rounds=5"])
    assert bare.method == {"fedavg": {"rounds": 5}}
    assert bare.train.batch_size == TrainConfig().batch_size


def test_overrides_are_typed():
    cfg = load_config(None, ["partition.num_clients=7", "data.image_size=null", "eval_local=true"])
    assert cfg.partition.num_clients == 7 and cfg.data.image_size is None and cfg.eval_local is True


@pytest.mark.parametrize(
    ("override", "level", "some_valid"),
    [
        ("bogus=1", "top level", "partition"),
        ("partition.alhpa=0.3", "partition", "alpha"),
        ("train.learning_rate=0.1", "train", "lr"),
        ("data.sorce=x", "data", "source"),
    ],
)
def test_unknown_keys_list_valid_keys_at_that_level(override, level, some_valid):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert f"valid keys at {level}" in msg and some_valid in msg
    assert override.split("=")[0] in msg


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  nme: cnn_small\n")
    with pytest.raises(
        ConfigError, match=r"model\.nme.*bad\.yaml.*valid keys at model: kwargs, name"
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("partition.num_clients=many", "partition.num_clients"),
        ("train.lr=-1", "lr"),
        ("device=tpu", "device"),
        ("scale=huge", "scale"),
        ("seeds=[]", "seeds"),
        ("parallel_clients=0", "parallel_clients"),
        ("threads_per_client=0", "threads_per_client"),
        ("eval_every=-1", "eval_every"),
        ("target_accuracy=60", "target_accuracy is a fraction"),
        ("link_mbps=0", "link_mbps"),
        ("train.lr", "key=value"),
    ],
)
def test_bad_values_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "broken.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(None, ["partition.alpha=0.3", "method.ensemble.weighting=data_size"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg
    d = to_dict(cfg)
    assert d["partition"]["alpha"] == 0.3 and d["train"]["lr"] == cfg.train.lr


def test_method_config_validation():
    assert method_config(FedAvg, {"rounds": 3}).rounds == 3
    assert method_config(FedProx, {}).mu == FedProx.Config().mu
    with pytest.raises(
        ConfigError,
        match=r"unknown option 'round' \(did you mean 'rounds'\?\) for method 'fedavg'; "
        r"valid: client_fraction, rounds, weighting",
    ):
        method_config(FedAvg, {"round": 3})
    with pytest.raises(ConfigError, match=r"method\.ensemble: unknown client weighting"):
        method_config(Ensemble, {"weighting": "median"})
    with pytest.raises(ConfigError, match="fedavg"):
        method_config(FedAvg, {"rounds": "many"})


def test_sweeps_expand_to_a_grid():
    grid = expand_sweeps(["partition.alpha=0.1,1.0", "seeds=0,1,2"])
    assert len(grid) == 6
    assert grid[0] == {"partition.alpha": "0.1", "seeds": "[0]"}
    assert grid[-1] == {"partition.alpha": "1.0", "seeds": "[2]"}
    assert expand_sweeps([]) == [{}]
    assert expand_sweeps(["methods=[fedavg,ensemble],local"]) == [
        {"methods": "[fedavg,ensemble]"},
        {"methods": "[local]"},
    ]
    assert sweep_label({"partition.alpha": "0.1", "seeds": "[0]"}) == "partition.alpha=0.1"
    assert merge_sweeps(["a=1,2", "b=3"], ["a=5", "c=6"]) == ["b=3", "a=5", "c=6"]
    for bad in ("alpha", "=1,2", "a="):
        with pytest.raises(ConfigError, match="key=v1,v2"):
            expand_sweeps([bad])
    with pytest.raises(ConfigError, match="twice"):
        expand_sweeps(["a=1,2", "a=3"])
    # every grid point is a valid override set
    for point in grid:
        cfg = load_config(None, [f"{k}={v}" for k, v in point.items()])
        assert len(cfg.seeds) == 1


def test_the_config_package_has_one_job_per_module_and_keeps_its_names():
    """``osfl.config`` is a package (schema, loading, method options, hints,
    option docs, sweeps), each module under 500 lines, and every name its
    importers use is still importable from ``osfl.config``."""
    import osfl.config as config

    root = Path(config.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in root.glob("*.py")}
    assert {"schema.py", "loading.py", "hints.py", "options.py", "sweeps.py"} <= set(sizes)
    assert max(sizes.values()) < 500, sizes
    for name in config.__all__:
        assert getattr(config, name) is not None
    assert not hasattr(config, "config_tree")  # dead: nothing used it


def test_an_old_autocast_key_in_yaml_names_amp(tmp_path):
    """FitConfig's ``autocast: bfloat16|none`` is now ``amp: true|false`` (the
    name ``train.amp`` has): a YAML file with the old key gets one line saying
    what to write."""
    p = tmp_path / "old.yaml"
    p.write_text(
        "methods: [falcon]\nmethod:\n  falcon:\n    classifier_fit:\n      autocast: bfloat16\n"
    )
    cfg = load_config(p)
    with pytest.raises(ConfigError) as e:
        method_config(FALCON, cfg.method["falcon"])
    assert str(e.value) == (
        "method.falcon.classifier_fit.autocast was renamed method.falcon.classifier_fit.amp: "
        "write method.falcon.classifier_fit.amp=true (was bfloat16) or false (was none)"
    )
    fit = method_config(FALCON, {"classifier_fit": {"amp": True}}).classifier_fit
    assert fit.amp is True


def test_fit_config_is_an_optim_config_with_its_own_defaults():
    """One optimizer spec: FitConfig reuses OptimConfig's fields and checks;
    its user-facing defaults are those it always had."""
    from osfl.fl.optim import OptimConfig
    from osfl.fl.tensor_fit import FitConfig

    fit = FitConfig()
    assert isinstance(fit, OptimConfig)
    assert (fit.optimizer, fit.lr, fit.weight_decay, fit.schedule, fit.grad_clip) == (
        "adam",
        5e-4,
        0.0,
        "constant",
        None,
    )
    assert (fit.epochs, fit.batch_size, fit.keep, fit.amp) == (60, 256, "last", False)
    with pytest.raises(ConfigError, match="lr must be > 0"):
        FitConfig(lr=0.0)
