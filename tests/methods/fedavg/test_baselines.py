"""The baselines: FedAvg (one-shot, multi-round), FedProx, Ensemble, Local."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch
from torch import nn

from osfl.assembly import SeedContext
from osfl.config import load_config
from osfl.errors import ConfigError, UploadError
from osfl.experiment import run_experiment
from osfl.fl.method import METHODS, PerClientPredictor
from osfl.fl.upload import Upload, validate
from osfl.methods import default_methods
from osfl.methods.clients import average_states, sample_counts
from osfl.methods.ensemble import EnsembleConfig, EnsemblePredictor
from osfl.methods.fedavg import FedAvg, FedAvgConfig, FedProx, FedProxConfig
from support.simulate import simulate, state_of
from support.tiny import TINY_BASELINES


def one_epoch(ctx: SeedContext) -> SeedContext:
    """``ctx`` with one local epoch per round (multi-round tests in less time)."""
    run = dataclasses.replace(ctx.run, train=dataclasses.replace(ctx.run.train, epochs=1))
    return dataclasses.replace(ctx, run=run)


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- averaging
def test_average_states_hand_computed():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(20)}
    out = average_states([a, b], [1, 3])
    assert torch.equal(out["w"], torch.tensor([2.5, 3.5]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 18  # 17.5 rounds to even 18
    out = average_states([a, b], [1, 2])
    assert int(out["n"]) == 17  # 16.67 -> 17


def test_averaging_identical_models_returns_the_same_model():
    torch.manual_seed(0)
    s = {"w": torch.randn(5, 7), "b": torch.randn(7).double(), "n": torch.tensor(41)}
    out = average_states([s, s, s], [0.2, 0.3, 0.5])
    assert_same_state(out, s)
    assert_same_state(average_states([s], [17]), s)


def test_sample_counts_drop_bad_metadata(caplog):
    good = Upload(tensors={}, meta={"num_samples": 4})
    bad = [Upload(meta={"num_samples": v}) for v in (-1, 0, 2.5, True, "3")]
    with caplog.at_level(logging.WARNING):
        counts = sample_counts({0: good, **{i + 1: u for i, u in enumerate(bad)}})
    assert counts == {0: 4}
    assert "num_samples" in caplog.text
    with pytest.raises(UploadError, match="num_samples"):
        sample_counts({1: bad[0]})


def test_ensemble_predictor_hand_computed():
    class Const(nn.Module):
        def __init__(self, logits: list[float]):
            super().__init__()
            self.logits = torch.tensor(logits)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.logits.expand(x.shape[0], -1)

    m1, m2 = Const([0.0, 0.0]), Const([0.0, float(torch.log(torch.tensor(3.0)))])
    x = torch.zeros(2, 1, 2, 2)
    out = EnsemblePredictor([m1, m2])(x)  # (0.5, 0.5) and (0.25, 0.75) averaged
    assert torch.allclose(out, torch.tensor([[0.375, 0.625]] * 2))
    out = EnsemblePredictor([m1, m2], weights=[1, 3])(x)
    assert torch.allclose(out, torch.tensor([[0.3125, 0.6875]] * 2))
    with pytest.raises(ValueError):
        EnsemblePredictor([m1, m2], weights=[1, -1])
    with pytest.raises(ValueError):
        EnsemblePredictor([])


# --------------------------------------------------------------------------- configs
def test_method_configs_refuse_bad_values():
    for bad in (
        {"rounds": 0},
        {"client_fraction": 0.0},
        {"client_fraction": 1.5},
    ):
        with pytest.raises(ConfigError):
            FedAvgConfig(**bad)
    with pytest.raises(ConfigError, match="data_size, uniform"):
        FedAvgConfig(weighting="median")
    with pytest.raises(ConfigError, match="data_size, uniform"):
        EnsembleConfig(weighting="softmax")
    with pytest.raises(ConfigError, match="mu"):
        FedProxConfig(mu=-0.1)


def test_registry_and_default_run():
    for name in ("fedavg", "fedprox", "ensemble", "local"):
        assert name in METHODS
    defaults = default_methods()
    assert defaults[:3] == ["local", "fedavg", "ensemble"]
    assert "fedprox" not in defaults


# --------------------------------------------------------------------------- runs
def test_upload_spec_refuses_a_foreign_model(make_ctx):
    ctx = make_ctx()
    method = FedAvg(FedAvgConfig(), ctx.run)
    state = method.init_state()
    spec = method.upload_spec(state, 0, 0)
    ok = Upload(tensors=dict(state), meta={"num_samples": 3})
    validate(ok, spec, client=0)
    wrong = dict(state)
    key = next(k for k, v in state.items() if v.ndim == 4)
    wrong[key] = torch.zeros(1, 1, 1, 1)
    with pytest.raises(UploadError, match="shape"):
        validate(Upload(tensors=wrong, meta={"num_samples": 3}), spec, client=2)
    with pytest.raises(UploadError, match="num_samples"):
        validate(Upload(tensors=dict(state)), spec, client=2)


def test_one_shot_fedavg_with_one_client_is_that_clients_model(make_ctx):
    ctx = make_ctx(1)
    fedavg = simulate(FedAvg, FedAvgConfig(), ctx)
    local = simulate(METHODS.get("local"), METHODS.get("local").Config(), ctx)
    assert isinstance(local.predictor, PerClientPredictor) and len(local.predictor.models) == 1
    assert_same_state(state_of(fedavg.predictor.model), state_of(local.predictor.models[0]))
    # the one client moved away from the common initialisation
    init = FedAvg(FedAvgConfig(), ctx.run).init_state()
    assert any(not torch.equal(init[k], fedavg.state[k]) for k in init)


def test_ensemble_after_fedavg_trains_no_client(make_ctx, monkeypatch):
    import osfl.fl.client_training as cache_mod

    ctx = make_ctx()
    calls = []
    real = cache_mod.train_local

    def counting(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cache_mod, "train_local", counting)
    cache = ctx.run.cache
    simulate(FedAvg, FedAvgConfig(), ctx)
    assert len(calls) == 3 and cache.misses == 3
    hits = cache.hits
    ens = simulate(METHODS.get("ensemble"), EnsembleConfig(), ctx)
    assert len(calls) == 3  # nothing trained again
    assert cache.hits == hits + 3
    assert isinstance(ens.predictor, EnsemblePredictor) and len(ens.predictor.models) == 3
    assert ens.bytes_up == simulate(FedAvg, FedAvgConfig(), ctx).bytes_up  # same uploads


def test_fedprox_with_mu_zero_is_fedavg(make_ctx):
    ctx = one_epoch(make_ctx())
    avg = simulate(FedAvg, FedAvgConfig(rounds=2), ctx)
    prox0 = simulate(FedProx, FedProxConfig(rounds=2, mu=0.0), ctx)
    prox = simulate(FedProx, FedProxConfig(rounds=2, mu=1.0), ctx)
    assert_same_state(avg.state, prox0.state)
    assert any(not torch.equal(avg.state[k], prox.state[k]) for k in avg.state)
    assert len(avg.rounds) == 2
    assert avg.rounds[0].bytes_down == avg.rounds[1].bytes_down == avg.bytes_down // 2 > 0


def test_multi_round_client_fraction(make_ctx):
    ctx = one_epoch(make_ctx(4))
    res = simulate(FedAvg, FedAvgConfig(rounds=3, client_fraction=0.5), ctx)
    assert [len(r.clients) for r in res.rounds] == [2, 2, 2]
    per_upload = res.rounds[0].bytes_up // 2
    assert res.bytes_up == 6 * per_upload


def test_digits_ensemble_and_multi_round_fedavg_beat_chance(tmp_path):
    """16 px digits, cnn_small, 4 clients (Dirichlet 0.5): both far above 10 %."""
    cfg = load_config(
        None,
        [
            *TINY_BASELINES,
            "train.epochs=8",
            "methods=[ensemble,fedavg]",
            "method.fedavg={rounds: 4}",
            "method_train.fedavg.epochs=2",
            "progress=false",
            "threads_per_client=1",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    records = {r["method"]: r for r in run_experiment(cfg)}
    assert records["ensemble"]["global_test_accuracy"] > 0.6
    assert records["fedavg"]["global_test_accuracy"] > 0.6
    assert records["fedavg"]["rounds"] == 4
