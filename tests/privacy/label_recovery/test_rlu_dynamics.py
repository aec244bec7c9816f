"""RLU's Table 1 as osfl reads it from an Observation (``schemes.py``,
``coefficients.py``): for every scheme, the proximal weight λ and the
per-step bias offset ``d`` (SCAFFOLD ``c − c_i``, FedDyn ``−grad``, FedDC
``λ·drift + correction``, weight decay ``λ_wd·b``), exactly; the refusals;
and ρ(τ) of combinations Table 1 does not list against ``torch.optim.SGD``.
A tiny linear model with four classes stands in for the architecture.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.observation import Observation
from osfl.privacy.label_recovery.base import ObservationError, resolve
from osfl.privacy.label_recovery.coefficients import LocalDynamics, rho_numeric
from osfl.privacy.label_recovery.schemes import local_dynamics

C = np.array([0.5, -0.25, 1.0, 0.0])
CI = np.array([0.125, 0.5, -1.0, 2.0])


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def get_classifier(self) -> nn.Module:
        return self.fc

    def forward(self, x):
        return self.fc(x)


def _dyn(fl=None, history=None, round=1, **train):
    torch.manual_seed(0)
    state = Tiny().state_dict()
    recipe = {"lr": 0.1, "batch_size": 2, "steps": 3, **train}
    obs = Observation(
        client_id=0,
        round=round,
        broadcast=state,
        upload={k: v + 0.5 for k, v in state.items()},
        hparams={"train": recipe, "fl": fl or {}},
        history={f"history.{k}.fc.bias": torch.tensor(v) for k, v in (history or {}).items()},
    )
    x = resolve(obs, model=Tiny())
    dyn, drift = local_dynamics(x)
    return dyn, drift, x


def test_fedavg_and_fedprox():
    dyn, drift, _ = _dyn()
    assert dyn == LocalDynamics(lr=0.1) and drift is None
    for key in ("mu", "lambda", "lam"):
        dyn, drift, _ = _dyn({"scheme": "fedprox", key: 0.5})
        assert dyn == LocalDynamics(lr=0.1, prox=0.5) and drift is None
    dyn, _, _ = _dyn({"scheme": "fedprox", "mu": None, "lam": 0.25})
    assert dyn.prox == 0.25
    dyn, _, _ = _dyn({"scheme": "fedprox"})  # no μ recorded: no proximal term
    assert dyn.prox == 0.0 and dyn.rho(3).tolist() == [1.0, 1.0, 1.0]


def test_scaffold_offset_is_c_minus_ci():
    _, drift, _ = _dyn({"scheme": "scaffold"}, {"scaffold.c": C, "scaffold.c_i": CI})
    assert drift.tolist() == (C - CI).tolist()
    _, drift, _ = _dyn({"scheme": "scaffold"}, {"scaffold.c": C}, round=0)
    assert drift.tolist() == C.tolist()
    _, drift, _ = _dyn({"scheme": "scaffold"}, {"scaffold.c_i": CI}, round=0)
    assert drift.tolist() == (-CI).tolist()
    dyn, drift, _ = _dyn({"scheme": "scaffold"}, round=0)  # round 0: all histories are zero
    assert drift is None and dyn == LocalDynamics(lr=0.1)


def test_feddyn_offset_and_damping():
    dyn, drift, _ = _dyn({"scheme": "feddyn", "alpha": 0.5}, {"feddyn.grad": C})
    assert dyn == LocalDynamics(lr=0.1, prox=0.5) and drift.tolist() == (-C).tolist()
    dyn, drift, _ = _dyn({"scheme": "feddyn", "lambda": 0.25}, round=0)
    assert dyn.prox == 0.25 and drift is None


def test_feddc_offset():
    hist = {"feddc.drift": C, "feddc.correction": CI}
    dyn, drift, _ = _dyn({"scheme": "feddc", "alpha": 0.5}, hist)
    assert dyn.prox == 0.5
    np.testing.assert_allclose(drift, 0.5 * C + CI, rtol=0, atol=0)
    _, drift, _ = _dyn({"scheme": "feddc", "alpha": 0.5}, {"feddc.drift": C}, round=0)
    assert drift.tolist() == (0.5 * C).tolist()
    _, drift, _ = _dyn({"scheme": "feddc", "alpha": 0.5}, {"feddc.correction": CI}, round=0)
    assert drift.tolist() == CI.tolist()
    _, drift, _ = _dyn({"scheme": "feddc", "alpha": 0.5}, round=0)
    assert drift is None


@pytest.mark.parametrize(
    ("scheme", "tensor"),
    [
        ("scaffold", "history.scaffold.c"),
        ("feddyn", "history.feddyn.grad"),
        ("feddc", "history.feddc.drift"),
    ],
)
def test_later_rounds_need_the_history(scheme, tensor):
    with pytest.raises(ObservationError) as e:
        _dyn({"scheme": scheme})
    assert str(e.value) == (
        f"observation [client 0, round 1, field '{tensor}.fc.bias']: scheme {scheme!r} needs the "
        "recorded history tensor to compute RLU's h term (Table 1); record it or audit round 0 only"
    )


def test_weight_decay_adds_a_pull_towards_zero():
    dyn, drift, x = _dyn(weight_decay=0.01)
    assert dyn == LocalDynamics(lr=0.1, weight_decay=0.01)
    np.testing.assert_allclose(drift, 0.01 * x.b0, rtol=0, atol=0)
    _, drift, x = _dyn({"scheme": "scaffold"}, {"scaffold.c": C}, round=0, weight_decay=0.01)
    np.testing.assert_allclose(drift, C + 0.01 * x.b0, rtol=0, atol=0)


def test_optimisers():
    dyn, _, _ = _dyn(optimizer="sgdm", momentum=0.9)
    assert dyn == LocalDynamics(lr=0.1, momentum=0.9)
    dyn, _, _ = _dyn(optimizer="nesterov", momentum=0.5)
    assert dyn == LocalDynamics(lr=0.1, momentum=0.5, nesterov=True)
    for opt in ("adam", "adamw", "rmsprop"):
        with pytest.raises(ConfigError) as e:
            _dyn(optimizer=opt)
        assert str(e.value) == (
            "RLU models SGD-family local training (Table 1: sgd, sgdm, nesterov); "
            f"optimizer {opt!r} is not covered"
        )


# ------------------------------------------------------------------ the dynamics
def test_local_dynamics_refuses_what_is_not_linear_sgd():
    for kw, msg in [
        ({"lr": 0.0}, "lr must be > 0, got 0.0"),
        ({"lr": 0.1, "momentum": 1.0}, "momentum must lie in [0, 1), got 1.0"),
        ({"lr": 0.1, "momentum": -0.1}, "momentum must lie in [0, 1), got -0.1"),
        ({"lr": 0.1, "prox": -1.0}, "prox and weight_decay must be >= 0"),
        ({"lr": 0.1, "weight_decay": -1.0}, "prox and weight_decay must be >= 0"),
        ({"lr": 0.1, "nesterov": True}, "nesterov needs momentum > 0"),
    ]:
        with pytest.raises(ConfigError) as e:
            LocalDynamics(**kw)
        assert str(e.value) == msg
    with pytest.raises(ConfigError) as e:
        LocalDynamics(lr=0.1).rho(0)
    assert str(e.value) == "steps must be >= 1, got 0"
    assert LocalDynamics(lr=0.1).rho(1).tolist() == [1.0]


def test_history_is_the_offset_through_the_dynamics():
    dyn = LocalDynamics(lr=0.1, prox=0.5, weight_decay=0.5)
    assert dyn.damping == 1.0
    np.testing.assert_allclose(dyn.rho(3), [0.81, 0.9, 1.0], rtol=1e-12)
    np.testing.assert_allclose(
        dyn.history(np.array([1.0, -2.0]), 3), 0.1 * 2.71 * np.array([1.0, -2.0])
    )
    assert dyn.history(None, 3) == 0.0


@pytest.mark.parametrize(
    "dyn",
    [
        LocalDynamics(lr=0.05, momentum=0.9, prox=2.0),
        LocalDynamics(lr=0.05, momentum=0.5, nesterov=True, prox=1.0),
        LocalDynamics(lr=0.1, momentum=0.3, weight_decay=0.5),
    ],
    ids=["sgdm+prox", "nag+prox", "sgdm+wd"],
)
def test_rho_without_a_closed_form_is_torch_sgd(dyn):
    """Momentum with a proximal pull: ``rho`` falls back to ``rho_numeric``, the
    impulse response of the recursion; it must be what torch.optim.SGD does."""
    m = 5
    rho = dyn.rho(m)
    np.testing.assert_allclose(rho, rho_numeric(m, dyn), rtol=0, atol=0)
    g = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.2], dtype=torch.float64)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([b], lr=dyn.lr, momentum=dyn.momentum, nesterov=dyn.nesterov)
    for k in range(m):
        opt.zero_grad()
        (b * g[k] + 0.5 * dyn.damping * b.pow(2)).sum().backward()
        opt.step()
    assert float(b.detach()) == pytest.approx(-dyn.lr * float(rho @ g.numpy()), rel=1e-10)
