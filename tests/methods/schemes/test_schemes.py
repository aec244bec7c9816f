"""SCAFFOLD, FedDyn, FedDC together: the terms registered, switched off and
refusing mismatched state, the effective step sum, exact reduction to FedAvg
when the extra terms are off, each scheme with each optimizer, the configs' refusals,
checkpointable state, and learning on digits (each scheme's own tests:
test_scaffold.py, test_feddyn.py, test_feddc.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import METHODS
from osfl.fl.objectives import (
    OBJECTIVE_TERMS,
    FedDCTerm,
    FedDynTerm,
    ScaffoldCorrection,
    effective_lr_sum,
)
from osfl.fl.train_config import TrainConfig
from osfl.methods.schemes import SchemeState
from support.schemes import (
    make_run,
    one_full_batch_step,
    simulate,
    tiny_model,
)


# --------------------------------------------------------------------------- terms
def test_terms_are_registered() -> None:
    for name, cls in [
        ("scaffold", ScaffoldCorrection),
        ("feddyn", FedDynTerm),
        ("feddc", FedDCTerm),
    ]:
        assert OBJECTIVE_TERMS.get(name) is cls


def test_effective_lr_sum() -> None:
    assert effective_lr_sum([0.1] * 4) == pytest.approx(0.4)
    # heavy ball, 2 steps: g1 acts with eta (1 + gamma), g2 with eta
    assert effective_lr_sum([1.0, 1.0], momentum=0.5) == pytest.approx(1.5 + 1.0)
    # Nesterov, 2 steps: g1 -> 1 + .5 * 1.5, g2 -> 1 + .5 * 1
    assert effective_lr_sum([1.0, 1.0], 0.5, nesterov=True) == pytest.approx(1.75 + 1.5)


@pytest.mark.parametrize("optimizer", ["sgdm", "nesterov"])
def test_effective_lr_sum_recovers_a_constant_gradient(optimizer: str) -> None:
    """With a constant gradient g, (x - y) / effective_lr_sum == g for every optimizer."""
    p = nn.Parameter(torch.zeros(3))
    cfg = TrainConfig(optimizer=optimizer, lr=0.1, momentum=0.9)
    from osfl.fl.optim import build_optimizer

    opt = build_optimizer([p], cfg)
    g = torch.tensor([1.0, -2.0, 0.5])
    for _ in range(7):
        p.grad = g.clone()
        opt.step()
    d = effective_lr_sum([0.1] * 7, 0.9, nesterov=optimizer == "nesterov")
    torch.testing.assert_close(-p.detach() / d, g)


def test_terms_off_add_nothing() -> None:
    w = tiny_model()
    for term in (
        ScaffoldCorrection(None, None),
        FedDynTerm(dict(w.named_parameters()), None, 0.0),
        FedDCTerm(dict(w.named_parameters()), None, None, 0.0),
    ):
        plain, with_term = tiny_model(), tiny_model()
        one_full_batch_step(plain, [])
        one_full_batch_step(with_term, [term])
        for a, b in zip(plain.parameters(), with_term.parameters(), strict=True):
            assert torch.equal(a, b)


def test_terms_refuse_mismatched_state() -> None:
    model = tiny_model()
    bad = {k: torch.zeros(2) for k, _ in model.named_parameters()}
    with pytest.raises(ConfigError, match="shape"):
        ScaffoldCorrection(bad, None).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="lacks parameter"):
        FedDynTerm({}, None, 0.1).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="alpha"):
        FedDCTerm({}, None, None, -1.0)


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize(
    ("name", "off"),
    [
        ("scaffold", {"option": "none"}),
        ("feddyn", {"alpha": 0.0}),
        ("feddc", {"alpha": 0.0, "drift": False, "correction": False}),
    ],
)
def test_reduces_to_fedavg_when_the_extra_term_is_off(digits, name: str, off: dict) -> None:
    train, _, fed = digits
    run = make_run(train, 5)
    common = {"rounds": 2, "weighting": "uniform"}
    _, ref = simulate("fedavg", common, train, fed, run)
    _, got = simulate(name, {**common, **off}, train, fed, run)
    assert ref.state.keys() == got.state.model.keys()
    for k, v in ref.state.items():
        torch.testing.assert_close(got.state.model[k], v, rtol=0, atol=1e-7)


_FEDAVG: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("name", "opts", "optimizer"),
    [
        *[
            (n, o, opt)
            for n, o in [("scaffold", {}), ("feddyn", {"alpha": 0.1}), ("feddc", {})]
            for opt in ("sgd", "sgdm", "nesterov")
        ],
        ("scaffold", {"option": "I"}, "sgdm"),
    ],
)
def test_each_scheme_runs_with_each_optimizer(digits, name, opts, optimizer) -> None:
    train, _, fed = digits
    run = make_run(train, 5, optimizer=optimizer, lr=0.02)
    method, res = simulate(name, {"rounds": 2, **opts}, train, fed, run)
    assert isinstance(res.state, SchemeState)
    for v in res.state.model.values():
        assert torch.isfinite(v.float()).all()
    if optimizer not in _FEDAVG:
        _FEDAVG[optimizer] = simulate(
            "fedavg", {"rounds": 2, "weighting": "uniform"}, train, fed, run
        )[1]
    ref = _FEDAVG[optimizer]
    diff = max(float((res.state.model[k] - v).abs().max()) for k, v in ref.state.items())
    assert diff > 1e-6  # the scheme's term changed training (SCAFFOLD: from round 1 on)
    hp = method.public_hparams()
    assert hp["fl"]["scheme"] == name and hp["train"]["optimizer"] == optimizer


def test_scheme_configs_refuse_bad_values() -> None:
    for name, bad in [
        ("scaffold", {"option": "III"}),
        ("scaffold", {"server_lr": 0.0}),
        ("feddyn", {"alpha": -0.1}),
        ("feddc", {"alpha": -1.0}),
        ("feddc", {"rounds": 0}),
    ]:
        with pytest.raises(ConfigError):
            METHODS.get(name).Config(**bad)


def test_checkpointable_state(digits) -> None:
    train, _, fed = digits
    run = make_run(train, 5)
    _, res = simulate("feddc", {"rounds": 1}, train, fed, run)
    flat = res.state.state_dict()
    assert any(k.startswith("model.") for k in flat)
    assert any(k.startswith("clients.0.drift.") for k in flat)


@pytest.mark.parametrize("name", ["scaffold", "feddyn", "feddc"])
def test_multi_round_learns_on_digits(digits, name: str) -> None:
    train, test, fed = digits
    run = make_run(train, 5, epochs=2, optimizer="nesterov", lr=0.02)
    _, res = simulate(name, {"rounds": 3}, train, fed, run, test=test)
    acc = res.metrics["global_test_accuracy"]
    assert acc > 0.4, f"{name} reached {acc:.3f} on digits (chance 0.1)"
    assert np.isfinite(acc)
