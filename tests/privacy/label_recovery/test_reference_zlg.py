"""ZLG+ and ``zlg+fedavg`` against Dimitrov et al.'s code ("Data Leakage in
Federated Averaging", TMLR 2022), which implements Geng et al.'s count
estimate ("AAAI" in the code) and its interpolation over FedAvg's local steps.

Reference: github.com/eth-sri/fedavg_leakage, commit
0edb1b948a9003c88b2f74d9105c68e22e90cc47, ``fedavg/utils/flax_losses.py``,
the closures ``calc_AAAI_label_stats``, ``calc_AAAI_raw_cnts``,
``round_label_cnts`` and ``restore_labels`` of
``flax_get_attack_loss_and_update`` (Apache License 2.0, © the authors),
restated below in NumPy (the originals are JAX closures inside a factory
that needs the whole training setup; ``jax.lax.top_k`` puts the lower index
first among ties, as ``argsort(kind="stable")`` of the negated values does).

Their conventions: ``grads`` is the client's update divided by ``−lr`` (the
sum of the per-step mean-loss gradients), ``dW`` its output-kernel summed over
the input axis (osfl's row sums), ``K`` the number of samples (osfl's
``total``), ``s`` the number of local steps. ``K·dW/s`` is then osfl's
summed-gradient surrogate, so the raw estimates agree to rounding (1e-9).

Where osfl deliberately differs (each tested below):

- statistics: the code feeds Gaussian dummy inputs (Geng et al.'s ZLG);
  osfl's ZLG+ feeds the server's auxiliary set, the variant RLU compares
  with; the formulas given the statistics are the same (compared here on
  auxiliary images);
- rounding after clipping: with no negative raw estimate both round alike;
  with negatives the code floors and takes the excess from the smallest
  remainders, osfl renormalises the clipped estimate to ``total`` and then
  hands out the largest remainders;
- ``interpolate="end"`` is the local model's statistics; the code's
  ``aaai_en`` takes the *last* coefficient of ``arange(0, 1, 1/T)``, which is
  ``(T−1)/T`` (or 1 − 1e-16 where float rounding adds an entry, e.g. T = 49).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import run_attack
from osfl.privacy.label_recovery.zlg import zlg_counts, zlg_estimate
from osfl.privacy.label_recovery.zlg_fedavg import interpolated_counts
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10


# ------------------------------------------------------------------ the authors' code, restated
def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """``jax.lax.top_k(x, k)[1]``: indices of the k largest, lower index first among ties."""
    return np.argsort(-np.asarray(x), kind="stable")[: int(k)]


def calc_aaai_raw_cnts(ps, O, dW, s, K):  # noqa: E741 (the code's names)
    return K * ps - (K * dW) / O / s


def round_label_cnts(cnts: np.ndarray, K: int) -> np.ndarray:
    cnts = np.asarray(cnts, dtype=np.float64)
    cnts_fl = np.maximum(np.floor(cnts).astype(int), 0)
    cnts_rem = K - np.sum(cnts_fl)
    cnts_rem_arr = cnts - cnts_fl
    if cnts_rem >= 0:
        idx = top_k(cnts_rem_arr, cnts_rem)
        out = cnts_fl.copy()
        out[idx] = cnts_fl[idx] + 1
    else:
        max_rm = -cnts_rem
        rem = 0
        if -cnts_rem > np.sum(cnts_fl >= 0.1):
            rem = -cnts_rem - np.sum(cnts_fl >= 0.1)
            max_rm = np.sum(cnts_fl >= 0.1)
        cnts_rem_arr = cnts_rem_arr.copy()
        cnts_rem_arr[cnts_fl <= 0.1] = 1
        idx = top_k(-cnts_rem_arr, max_rm)
        out = cnts_fl.copy()
        out[idx] = cnts_fl[idx] - 1
        if rem > 0:
            idx = top_k(cnts_fl, rem)
            out[idx] = out[idx] - 1
    return out


def label_stats(logits: torch.Tensor, last_relu: torch.Tensor) -> tuple[np.ndarray, float]:
    """``calc_AAAI_label_stats`` on given inputs: mean softmax and mean summed embedding."""
    ps = torch.softmax(logits.double(), dim=1).mean(dim=0).numpy()
    return ps, float(last_relu.double().sum(dim=-1).mean())


def restore_labels(dW, stats_start, stats_end, K, steps, mode="aaai_avg"):
    """``restore_labels`` from ``dW`` and the two models' statistics."""
    (ps_start, O_start), (ps_end, O_end) = stats_start, stats_end
    coefs = np.arange(0, 1, 1 / steps)
    Os = (1 - coefs) * O_start + coefs * O_end
    coefs = coefs.reshape(-1, 1)
    ps = (1 - coefs) @ ps_start.reshape(1, -1) + coefs @ ps_end.reshape(1, -1)
    idx_st, idx_en = {"aaai_st": (0, 1), "aaai_en": (-1, 0), "aaai_avg": (0, steps)}[mode]
    raw = np.stack([calc_aaai_raw_cnts(ps[j], Os[j], dW, steps, K) for j in range(idx_st, idx_en)])
    return round_label_cnts(raw.mean(axis=0), K), raw.mean(axis=0)


# ------------------------------------------------------------------ formulas on random inputs
def _random_case(seed: int, total: int = 24, k: int = 6):
    """Counts N, statistics and row sums that follow Geng et al.'s model up to
    noise, ``g = Ō (total·p̄ − N) + noise``; the noise sums to zero, as the row
    sums of a softmax-CE gradient do (``Σ_j (p_j − 1[y = j]) = 0``), so the raw
    estimates sum to ``total``."""
    rng = np.random.default_rng(seed)
    n = rng.multinomial(total, rng.dirichlet(np.ones(k)))
    p = rng.dirichlet(np.ones(k) * 5)
    o = float(rng.uniform(0.5, 3.0))
    noise = rng.normal(0, 0.4 * o, k)
    return n, p, o, o * (total * p - n) + noise - noise.mean()


@pytest.mark.parametrize("seed", range(30))
def test_zlg_estimate_and_counts_are_the_codes_start_estimate(seed):
    """One step: osfl's ``zlg_estimate`` is ``calc_AAAI_raw_cnts`` with
    ``dW = g/total`` and ``s = 1``; the counts are ``round_label_cnts`` of it
    whenever no estimate is negative (otherwise see the next test)."""
    n, p, o, g = _random_case(seed)
    total = int(n.sum())
    raw = calc_aaai_raw_cnts(p, o, g / total, 1, total)
    np.testing.assert_allclose(zlg_estimate(g, p, o, total), raw, rtol=1e-12, atol=1e-9)
    if raw.min() >= 0:
        assert zlg_counts(g, p, o, total).tolist() == round_label_cnts(raw, total).tolist()


def test_negative_estimates_are_renormalised_not_trimmed():
    """The deliberate rounding difference: raw ``[3.9, 3.9, 3.9, −3.7]`` for 8
    labels. The code floors to ``[3, 3, 3, 0]`` and removes one label from the
    smallest remainder (class 0 among ties): ``[2, 3, 3, 0]``; osfl scales the
    clipped ``[3.9, 3.9, 3.9, 0]`` to 8 (``8/3`` each) and gives the two
    largest remainders one more: ``[3, 3, 2, 0]``."""
    raw = np.array([3.9, 3.9, 3.9, -3.7])
    total, p, o = 8, np.full(4, 0.25), 1.0
    g = o * (total * p - raw)  # zlg_estimate(g, p, o, total) == raw
    np.testing.assert_allclose(zlg_estimate(g, p, o, total), raw, atol=1e-12)
    assert round_label_cnts(raw, total).tolist() == [2, 3, 3, 0]
    assert zlg_counts(g, p, o, total).tolist() == [3, 3, 2, 0]


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 49])
def test_interpolated_estimate_is_restore_labels_average(steps):
    """``zlg+fedavg`` (``interpolate="steps"``): the mean over the T steps of the
    estimate with linearly interpolated statistics is ``restore_labels`` with
    ``aaai_avg`` (``dW`` = the update's row sums over ``−lr``, i.e. ``g·T/total``)."""
    rng = np.random.default_rng(steps)
    total, k = 32, 5
    g = rng.normal(0, 2, k)
    p0, p1 = rng.dirichlet(np.ones(k) * 4), rng.dirichlet(np.ones(k) * 4)
    o0, o1 = 2.0, 3.5
    ours = interpolated_counts(g, p0, o0, p1, o1, total, steps)
    _, theirs = restore_labels(g * steps / total, (p0, o0), (p1, o1), total, steps)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("steps", [2, 5])
def test_end_mode_is_the_local_model_not_the_last_coefficient(steps):
    """The deliberate ``end`` difference: osfl's estimate uses the local model's
    statistics (coefficient 1); the code's ``aaai_en`` uses ``(T−1)/T``."""
    rng = np.random.default_rng(0)
    total, k = 16, 4
    g = rng.normal(0, 2, k)
    p0, p1 = rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k))
    o0, o1 = 1.0, 2.0
    ours = interpolated_counts(g, p1, o1, p1, o1, total, steps)  # what "end" computes
    np.testing.assert_allclose(ours, calc_aaai_raw_cnts(p1, o1, g * steps / total, steps, total))
    _, code_end = restore_labels(g * steps / total, (p0, o0), (p1, o1), total, steps, "aaai_en")
    c = (steps - 1) / steps
    expect = calc_aaai_raw_cnts(
        (1 - c) * p0 + c * p1, (1 - c) * o0 + c * o1, g * steps / total, steps, total
    )
    np.testing.assert_allclose(code_end, expect, rtol=1e-12)
    assert not np.allclose(ours, code_end)


# ------------------------------------------------------------------ end to end on an observation
def _observe(train, *, steps: int, seed: int = 3):
    """A three-class client of 32 samples, ``steps`` SGD steps of 8 (one epoch per 4 steps)."""
    rng = np.random.default_rng(seed)
    y = train.labels.numpy()
    pool = np.flatnonzero(np.isin(y, rng.choice(K, 3, replace=False)))
    client = train.subset(rng.choice(pool, 32, replace=False))
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=K, img_size=16)
    tc = TrainConfig(steps=steps, batch_size=8, lr=0.05, drop_last=True)
    obs, _ = simulate_observation(
        model, client, tc, model_spec=model_hparams("lenet5", {"img_size": 16}, K), seed=seed
    )
    return obs, model


def _stats_of(state: dict, aux) -> tuple[np.ndarray, float]:
    """The code's statistics of a model state on the auxiliary images (its
    ``last_relu`` = the input of the output layer, LeNet-5's ``features``)."""
    torch.manual_seed(0)
    net = create_model("lenet5", num_classes=K, img_size=16)
    net.load_state_dict({k: v for k, v in state.items() if k in net.state_dict()})
    net.eval()
    with torch.no_grad():
        x = aux.images.float() / 255.0
        e = net.features(x)
        return label_stats(net.fc3(e), e)


@pytest.mark.parametrize(
    ("mode", "code_mode", "steps"), [("start", "aaai_st", 1), ("steps", "aaai_avg", 4)]
)
def test_attack_is_restore_labels_on_an_observation(digits_with_aux, mode, code_mode, steps):
    """The whole attack on a simulated FedAvg update: osfl's raw estimate is
    ``restore_labels`` on the same update and auxiliary statistics (float32
    forwards, so 1e-6 relative), and the counts agree where the rounding
    conventions do (no negative raw estimate), else osfl's are the
    renormalised largest-remainder rounding of the same raw estimate."""
    train, aux = digits_with_aux
    obs, _ = _observe(train, steps=steps)
    res = run_attack("zlg+fedavg", obs, aux, interpolate=mode, bn_stats="running")
    head = "fc3.weight"
    dW = -(obs.upload[head].double() - obs.broadcast[head].double()).sum(dim=1).numpy() / 0.05
    start, end = _stats_of(obs.broadcast, aux), _stats_of(obs.upload, aux)
    total = len(obs.truth["labels"])
    counts, raw = restore_labels(dW, start, end, total, steps, code_mode)
    np.testing.assert_allclose(res.info["raw"], raw, rtol=1e-6, atol=1e-4)
    if raw.min() >= 0:
        assert res.counts.tolist() == counts.tolist()
    else:
        assert res.counts.tolist() == zlg_counts(-raw, np.zeros(K), 1.0, total).tolist()
