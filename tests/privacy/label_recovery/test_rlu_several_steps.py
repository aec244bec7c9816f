"""RLU's estimate for several local steps, by value (Chen & Vikalo, ICML
2024, Eq. 16 and Alg. 1 line 13; ``rlu.py`` docstring steps 2-3).

With ``m > 1`` steps RLU solves ``min_z ||C̄ z − u||`` on the simplex with

    u = (Δb + h) / (η Σ_τ ρ(τ))          C̄ = (C(θ^(t)) + C(θ_k^(t+1))) / 2,

the mean of the coefficient matrices under the global and the local model.
For one step of plain SGD (the only case the other tests build) ``Σ ρ = 1``
and the local ``C`` is not used, so an estimator that forgets either passes
them. Here three steps of SGD with momentum 0.9 (``Σ ρ = 2.71 + 1.9 + 1 =
5.61``, Eq. 45) under SCAFFOLD (``h = η Σρ (c − c_i)``, Table 1) from a
global model whose local counterpart answers differently (another output
layer), so that the global and the local ``C`` differ:

- what RLU hands its solver is ``u`` and ``C̄`` computed by hand;
- a bias update made from a known ``C̄`` and a known label proportion ``z``
  (a fixed point: the local ``C`` depends on the local bias) is read back
  as that ``z``, and its counts exactly;
- on a real three-step update, the trunk gain and ``κ`` of Alg. 2 are the
  values written out here (an estimator that falls back to the neutral
  gain 1, e.g. with the global and the local means exchanged, fails).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from osfl.fl.observation import Observation
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import run_attack
from osfl.privacy.label_recovery import rlu as rlu_module
from osfl.privacy.label_recovery.base import resolve
from osfl.privacy.label_recovery.moments import (
    ConfidenceSampler,
    coefficient_matrix,
    fit_gaussians,
)
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10
LR, STEPS, BATCH, MOMENTUM = 0.05, 3, 16, 0.9
SUM_RHO = (1 - MOMENTUM**3) / (1 - MOMENTUM) + (1 - MOMENTUM**2) / (1 - MOMENTUM) + 1.0  # 5.61
#: the true label counts of the 3 × 16 samples (every class present, none alike)
COUNTS = np.array([9, 2, 7, 3, 5, 1, 8, 4, 6, 3])
#: SCAFFOLD's control variates on the output bias (different on every class)
C_SERVER = np.linspace(-0.3, 0.4, K)
C_CLIENT = np.array([0.2, -0.1, 0.05, 0.3, -0.25, 0.1, 0.0, -0.2, 0.15, -0.05])
MC_SAMPLES = 2048


def _models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The global model (an output bias that favours some classes) and a local
    model with another output layer, so that the two ``C`` differ."""
    torch.manual_seed(0)
    global_model = create_model("lenet5", num_classes=K, img_size=16)
    local = copy.deepcopy(global_model)
    with torch.no_grad():
        global_model.fc3.bias.copy_(torch.linspace(1.0, -1.0, K))
        local.fc3.bias.copy_(global_model.fc3.bias)
        g = torch.Generator().manual_seed(5)
        local.fc3.weight.mul_(4.0).add_(0.3 * torch.randn(local.fc3.weight.shape, generator=g))
    return global_model, local


def _observation(global_model: torch.nn.Module, local_state: dict) -> Observation:
    return Observation(
        client_id=0,
        round=1,
        broadcast={k: v.detach().clone() for k, v in global_model.state_dict().items()},
        upload={k: v.detach().clone() for k, v in local_state.items()},
        hparams={
            "train": {
                "lr": LR,
                "batch_size": BATCH,
                "steps": STEPS,
                "optimizer": "sgdm",
                "momentum": MOMENTUM,
            },
            "fl": {"scheme": "scaffold"},
        },
        history={
            "history.scaffold.c.fc3.bias": torch.tensor(C_SERVER),
            "history.scaffold.c_i.fc3.bias": torch.tensor(C_CLIENT),
        },
    )


def _with_bias(local: torch.nn.Module, bias: np.ndarray) -> dict[str, torch.Tensor]:
    state = {k: v.detach().clone() for k, v in local.state_dict().items()}
    state["fc3.bias"] = torch.as_tensor(bias, dtype=state["fc3.bias"].dtype)
    return state


def _coefficients(obs: Observation, model: torch.nn.Module, aux) -> tuple[np.ndarray, np.ndarray]:
    """``C`` under the global and under the local model, each from its own
    Gaussian fit of the auxiliary logits (Eq. 8-9), as RLU fits them."""
    x = resolve(obs, model=model)
    out = []
    for which in ("global", "local"):
        q, _ = x.aux_outputs(which, aux, None, bn_stats="batch", device=torch.device("cpu"))
        gauss = fit_gaussians(q.numpy(), aux.labels.numpy(), K, ridge=1e-6)
        out.append(coefficient_matrix(ConfidenceSampler(gauss, MC_SAMPLES, 0).S()))
    return out[0], out[1]


@pytest.fixture(scope="module")
def setup(digits_with_aux):
    _, aux = digits_with_aux
    global_model, local = _models()
    b0 = global_model.fc3.bias.detach().double().numpy()
    return aux, global_model, local, b0


def test_rlu_hands_its_solver_u_and_the_mean_of_both_c(setup, monkeypatch) -> None:
    """``u = Δb / (η Σρ) + (c − c_i)`` and ``C̄ = (C_global + C_local) / 2``
    for three SGDm steps under SCAFFOLD, each by hand."""
    aux, global_model, local, b0 = setup
    db = np.array([0.12, -0.05, 0.08, -0.02, 0.03, -0.09, 0.1, -0.04, 0.02, -0.15])
    obs = _observation(global_model, _with_bias(local, b0 + db))
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = rlu_module.simplex_lstsq

    def spy(C, u, *args, **kwargs):
        seen.append((np.array(C), np.array(u)))
        return real(C, u, *args, **kwargs)

    monkeypatch.setattr(rlu_module, "simplex_lstsq", spy)
    run_attack("rlu", obs, aux, model=global_model, num_samples=MC_SAMPLES, posterior_iters=0)
    ((C, u),) = seen
    db_seen = resolve(obs, model=global_model).db  # the float32 bias's own rounding
    assert np.allclose(db_seen, db, atol=1e-6)
    np.testing.assert_allclose(u, db_seen / (LR * SUM_RHO) + (C_SERVER - C_CLIENT), rtol=1e-10)
    c_global, c_local = _coefficients(obs, global_model, aux)
    assert np.abs(c_global - c_local).max() > 0.05  # the two models answer differently
    np.testing.assert_allclose(C, 0.5 * (c_global + c_local), rtol=1e-10, atol=1e-12)


def test_a_bias_update_from_a_known_c_and_z_is_read_back_as_z(setup) -> None:
    """``Δb = η Σρ C̄ z − h``, with ``C̄`` the mean of the global ``C`` and the
    ``C`` of the local model that update gives (found by iterating to the
    fixed point), is read back as ``z`` on the simplex, and the counts are
    the true ones. Forgetting ``Σρ`` reads ``u`` 5.61 times too large;
    the local ``C`` alone, or the global alone, another matrix."""
    aux, global_model, local, b0 = setup
    z = COUNTS / COUNTS.sum()
    h = LR * SUM_RHO * (C_SERVER - C_CLIENT)
    db = np.zeros(K)
    for _ in range(30):
        obs = _observation(global_model, _with_bias(local, b0 + db))
        c_global, c_local = _coefficients(obs, global_model, aux)
        new = LR * SUM_RHO * 0.5 * (c_global + c_local) @ z - h
        # the upload stores the bias in float32: iterate on what it can hold
        new = (b0 + new).astype(np.float32).astype(np.float64) - b0
        if np.abs(new - db).max() < 1e-9:
            break
        db = new
    else:
        pytest.fail("the bias update did not reach its fixed point")
    obs = _observation(global_model, _with_bias(local, b0 + db))
    result = run_attack(
        "rlu", obs, aux, model=global_model, num_samples=MC_SAMPLES, posterior_iters=0
    )
    got = np.array(result.info["z"])
    np.testing.assert_allclose(got, z, atol=2e-5)
    assert result.counts.tolist() == COUNTS.tolist()
    # the global C alone does not explain this update: the local model's C matters
    u = (db + h) / (LR * SUM_RHO)
    assert np.abs(c_global @ z - u).max() > 20 * np.abs(0.5 * (c_global + c_local) @ z - u).max()


def test_the_trunk_gain_rlu_reports_is_the_ratio_of_the_two_models_shifts(digits_with_aux) -> None:
    """Alg. 2's logit-shift factor ``κ = (||ē||² + 1) · gain`` on a real
    three-step update, each value by hand: ``gain`` is the least-squares
    ratio of the observed class-mean logit shift (local minus global, both
    fitted on the auxiliary set) to the shift the output layer's update
    explains, both centred over the classes. The trunk learns too, so the
    gain is well above 1: the neutral value ``trunk_gain`` falls back to
    when the ratio is not positive (as it is when the global and the local
    means are exchanged) would not pass here."""
    train, aux = digits_with_aux
    client = train.subset(np.random.default_rng(1).choice(len(train), 120, replace=False))
    tc = TrainConfig(steps=STEPS, batch_size=BATCH, lr=0.05, drop_last=True)
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=K, img_size=16)
    spec = model_hparams("lenet5", {"img_size": 16}, K)
    obs, _ = simulate_observation(model, client, tc, model_spec=spec, seed=1)
    result = run_attack("rlu", obs, aux, num_samples=MC_SAMPLES, posterior_iters=1)

    x = resolve(obs)
    cpu = torch.device("cpu")
    labels = aux.labels.numpy()
    q_global, feats = x.aux_outputs("global", aux, None, bn_stats="batch", device=cpu)
    q_local, _ = x.aux_outputs("local", aux, None, bn_stats="batch", device=cpu)
    mu_global = np.stack([q_global.numpy()[labels == n].mean(0) for n in range(K)])
    mu_local = np.stack([q_local.numpy()[labels == n].mean(0) for n in range(K)])
    f = feats.numpy()
    explained = np.stack([(f[labels == n] @ x.dW.T + x.db).mean(0) for n in range(K)])
    observed = mu_local - mu_global
    explained -= explained.mean(1, keepdims=True)
    observed -= observed.mean(1, keepdims=True)
    gain = float((observed * explained).sum() / (explained * explained).sum())
    e_bar = (x.db @ x.dW) / (x.db @ x.db)
    assert gain > 1.2  # the trunk's own learning: far from the neutral 1
    assert result.info["trunk_gain"] == pytest.approx(gain, rel=1e-6)
    assert result.info["kappa"] == pytest.approx((e_bar @ e_bar + 1.0) * gain, rel=1e-6)
