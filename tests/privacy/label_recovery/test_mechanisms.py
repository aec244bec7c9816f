"""Mechanism tests of the label attacks: each fails when the attack's key
component is removed or inverted. Checked by breaking the code (not
committed) and seeing these fail: RLU with ``h = 0`` (SCAFFOLD, FedDyn
tests), with ``x.db − h`` (SCAFFOLD), with ρ of SGDm replaced by ones
(momentum), with FedDyn's damping λ = 0 (FedDyn), with ``C`` transposed
(skewed, rlu); LLG+ without ``− total·offset`` (skewed, llg+); ZLG+ without
``total·p̄`` (skewed, zlg+); iRLG with uniform restored softmaxes (skewed,
irlg). LLG+ without the per-label ``− offset_j`` is caught by
``test_reference_llg.py`` (this directory).

The client: 48 digits of four classes (20 / 14 / 8 / 6), an untrained
LeNet-5 at 16 px. Each test pairs the attack's result on an observation
where the component matters with the same attack told to ignore it (the
history zeroed, the optimiser mis-declared), so the threshold between the
two is shown to separate something.

- RLU's h term (Table 1): SCAFFOLD with ``c − c_i`` on the output bias of
  the size of the CE gradient, FedDyn with a non-zero gradient state — exact
  with the recorded history, far off with it zeroed;
- RLU's ρ(τ): three SGD steps with momentum 0.9 — near exact, but not when
  the observation claims plain SGD;
- the per-class terms of LLG+ (offset), ZLG+ (``total·p̄``), iRLG (the
  restored softmax) and RLU (the orientation of ``C``): a global model whose
  output bias favours some classes, so that the confidences differ by class;
  every attack is (nearly) exact there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from osfl.fl.objectives import FedDynTerm, ScaffoldCorrection
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import run_attack
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10
SPEC = model_hparams("lenet5", {"img_size": 16}, K)
#: output bias of the "skewed" global model: confidences that differ by class
SKEW = torch.tensor([1.5, 0.0, -1.0, 0.5, 0.0, -0.5, 1.0, 0.0, -1.5, 0.2])


@pytest.fixture(scope="module")
def client(digits_with_aux):
    train, aux = digits_with_aux
    y = train.labels.numpy()
    rng = np.random.default_rng(0)
    picks = [
        rng.choice(np.flatnonzero(y == c), n, replace=False)
        for c, n in [(2, 20), (7, 14), (5, 8), (0, 6)]
    ]
    return train.subset(rng.permutation(np.concatenate(picks))), aux


def _model(skew: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=K, img_size=16)
    if skew:
        with torch.no_grad():
            model.fc3.bias.copy_(SKEW)
    return model


def _iacc(name: str, obs, aux, **options) -> float:
    return run_attack(name, obs, aux, **options).score(obs.truth["labels"])["iAcc"]


def _bias_only(model: torch.nn.Module, bias: torch.Tensor) -> dict[str, torch.Tensor]:
    """A per-parameter state that is zero except on the output bias."""
    out = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    out["fc3.bias"] = bias
    return out


def test_rlu_h_term_on_a_scaffold_update(client):
    """SCAFFOLD adds ``c − c_i`` to every step's gradient; RLU's ``h = η m (c − c_i)``
    removes it from the bias update (Eq. 63). Without it the drift reads as labels."""
    data, aux = client
    model = _model()
    g = torch.Generator().manual_seed(1)
    cb, cib = torch.randn(K, generator=g) * 0.3, torch.randn(K, generator=g) * 0.3
    term = ScaffoldCorrection(_bias_only(model, cb), _bias_only(model, cib))
    history = {"history.scaffold.c.fc3.bias": cb, "history.scaffold.c_i.fc3.bias": cib}
    tc = TrainConfig(steps=3, batch_size=16, lr=0.01, drop_last=True)
    obs, _ = simulate_observation(
        model, data, tc, terms=[term], scheme="scaffold", history=history, model_spec=SPEC, round=1
    )
    assert _iacc("rlu", obs, aux) >= 0.95
    blind = dataclasses.replace(obs, history={k: torch.zeros(K) for k in history})
    assert _iacc("rlu", blind, aux) < 0.6


def test_rlu_h_term_and_damping_on_a_feddyn_update(client):
    """FedDyn's linear term ``−⟨grad, θ⟩`` is a constant offset ``−grad`` on every
    step and its proximal term damps earlier steps (ρ = (1 − αη)^{m−τ}); with
    both RLU is exact, with the state zeroed it is not."""
    data, aux = client
    model = _model()
    state = torch.randn(K, generator=torch.Generator().manual_seed(2)) * 0.3
    term = FedDynTerm(model, _bias_only(model, state), alpha=4.0)
    tc = TrainConfig(steps=3, batch_size=16, lr=0.05, drop_last=True)
    obs, _ = simulate_observation(
        model,
        data,
        tc,
        terms=[term],
        scheme="feddyn",
        scheme_params={"alpha": 4.0},
        history={"history.feddyn.grad.fc3.bias": state},
        model_spec=SPEC,
        round=1,
    )
    assert _iacc("rlu", obs, aux) >= 0.95
    blind = dataclasses.replace(obs, history={"history.feddyn.grad.fc3.bias": torch.zeros(K)})
    assert _iacc("rlu", blind, aux) < 0.7


def test_rlu_rho_of_momentum(client):
    """Three steps of SGD with momentum 0.9 move the bias by ``Σρ = 2.71 + 1.9 + 1
    = 5.61`` gradients, not 3 (Table 1, Eq. 45): dividing by that sum is what
    puts ``u`` on the simplex. Declared as plain SGD, RLU misreads the update."""
    data, aux = client
    tc = TrainConfig(
        steps=3, batch_size=16, lr=0.01, drop_last=True, optimizer="sgdm", momentum=0.9
    )
    obs, _ = simulate_observation(_model(), data, tc, model_spec=SPEC)
    assert _iacc("rlu", obs, aux) >= 0.95
    train = {**obs.hparams["train"], "optimizer": "sgd", "momentum": 0.0}
    blind = dataclasses.replace(obs, hparams={**obs.hparams, "train": train})
    assert _iacc("rlu", blind, aux) < 0.85


@pytest.fixture(scope="module")
def skewed(client):
    """One SGD step of all 48 samples from the skewed global model."""
    data, aux = client
    tc = TrainConfig(steps=1, batch_size=48, lr=0.01, drop_last=True)
    obs, _ = simulate_observation(_model(skew=True), data, tc, model_spec=SPEC)
    return obs, aux


@pytest.mark.parametrize(
    ("name", "floor"), [("llg+", 0.97), ("zlg+", 1.0), ("irlg", 1.0), ("rlu", 1.0)]
)
def test_per_class_terms_on_a_skewed_model(skewed, name, floor):
    """LLG+'s offsets ``s_j``, ZLG+'s ``total·p̄_j``, iRLG's restored ``P_c`` and
    RLU's ``C`` all carry how confident the model is in each class; with the
    confidences far from uniform, each attack is (nearly: LLG+ misplaces one
    label of 48) exact."""
    obs, aux = skewed
    assert _iacc(name, obs, aux) >= floor
