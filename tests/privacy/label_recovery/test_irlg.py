"""iRLG (Ma et al., ICLR 2023) as its three steps define it: class embeddings
``ê_c = ∇W_c / ∇b_c`` (a zero bias gradient floored to ±1e-12, keeping its
sign, +0 and −0 counting as +), softmaxes ``P_c = softmax(W ê_c + b)``, and
the least-squares count of the stacked bias and weight equations plus
``Σ N = total``. Compared with an independent computation (scipy's softmax,
``numpy.linalg.lstsq``) on cases where the embeddings differ by class and
the logits are large, where a softmax without its per-row shift overflows or
underflows.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

from osfl.privacy import run_attack
from osfl.privacy.label_recovery.irlg import irlg_counts


def reference(G_W, G_b, W, b, total):
    """Ma et al.'s system, built and solved independently of osfl's code."""
    K, L = G_W.shape
    E = G_W / G_b[:, None]
    P = scipy.special.softmax(E @ W.T + b, axis=1)  # row c: P_c
    rows, rhs = [], []
    for j in range(K):  # bias: Σ_c N_c (P_c − 1_c)_j = G_b_j
        rows.append([P[c, j] - (c == j) for c in range(K)])
        rhs.append(G_b[j])
    for j in range(K):  # weights: Σ_c N_c (P_c − 1_c)_j ê_c,l = G_W_j,l
        for col in range(L):
            rows.append([(P[c, j] - (c == j)) * E[c, col] for c in range(K)])
            rhs.append(G_W[j, col])
    A = np.array(rows)
    w = np.linalg.norm(A)
    A = np.vstack([A, w * np.ones((1, K))])
    y = np.array([*rhs, w * total])
    return np.linalg.lstsq(A, y, rcond=1e-10)[
        0
    ]  # singular values below 1e-10·max cut, as osfl's default


def _case(seed: int, scale: float = 1.0, k: int = 5, dim: int = 6):
    """Per-class embeddings e_c, output layer (W, b) and counts N; the gradients of
    softmax-CE summed over the N_c samples of each class."""
    rng = np.random.default_rng(seed)
    W, b = rng.normal(size=(k, dim)) * scale, rng.normal(size=k)
    e = np.abs(rng.normal(size=(k, dim)))
    n = rng.multinomial(12, np.ones(k) / k)
    P = scipy.special.softmax(e @ W.T + b, axis=1)
    G_b = sum(n[c] * (P[c] - np.eye(k)[c]) for c in range(k))
    G_W = sum(n[c] * np.outer(P[c] - np.eye(k)[c], e[c]) for c in range(k))
    return G_W, G_b, W, b, int(n.sum())


@pytest.mark.parametrize(("seed", "scale"), [(0, 1.0), (1, 1.0), (2, 60.0), (3, 200.0)])
def test_raw_counts_are_the_papers_system(seed, scale):
    G_W, G_b, W, b, total = _case(seed, scale)
    counts, raw = irlg_counts(G_W, G_b, W, b, total)
    ref = reference(G_W, G_b, W, b, total)
    assert np.isfinite(raw).all()
    np.testing.assert_allclose(raw, ref, rtol=1e-7, atol=1e-7)
    assert counts.sum() == total


def test_a_zero_bias_gradient_is_floored_keeping_its_sign():
    G_W, G_b, W, b, total = _case(4)
    for zero, floor in [(0.0, 1e-12), (-0.0, 1e-12), (-1e-13, -1e-12), (1e-13, 1e-12)]:
        G_b0, G_bf = G_b.copy(), G_b.copy()
        G_b0[2], G_bf[2] = zero, floor
        np.testing.assert_array_equal(
            irlg_counts(G_W, G_b0, W, b, total)[1], irlg_counts(G_W, G_bf, W, b, total)[1]
        )
    G_bf[2] = 1.0
    assert not np.allclose(
        irlg_counts(G_W, G_b0, W, b, total)[1], irlg_counts(G_W, G_bf, W, b, total)[1]
    )
    # the floor keeps the sign: +1e-13 and -1e-13 give different systems
    G_bf[2] = -G_b0[2]
    assert G_b0[2] == 1e-13
    assert not np.array_equal(
        irlg_counts(G_W, G_b0, W, b, total)[1], irlg_counts(G_W, G_bf, W, b, total)[1]
    )


def test_rcond_cuts_small_singular_values():
    """A large ``rcond`` drops directions of the system, and the option reaches
    the solver from ``run_attack`` (``info["raw"]``)."""
    G_W, G_b, W, b, total = _case(5)
    _, sharp = irlg_counts(G_W, G_b, W, b, total, rcond=1e-10)
    _, blunt = irlg_counts(G_W, G_b, W, b, total, rcond=0.5)
    assert not np.allclose(sharp, blunt, atol=1e-3)
    _, default = irlg_counts(G_W, G_b, W, b, total)
    np.testing.assert_array_equal(default, sharp)


def test_the_attack_passes_its_rcond_and_reports_the_raw_solution(digits_with_aux):
    import torch

    from osfl.fl.train_config import TrainConfig
    from osfl.models import create_model
    from osfl.privacy.label_recovery.base import resolve
    from osfl.privacy.simulate import model_hparams, simulate_observation

    train, _ = digits_with_aux
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=10, img_size=16)
    tc = TrainConfig(steps=1, batch_size=16, lr=0.01, drop_last=True)
    obs, _ = simulate_observation(
        model, train.subset(range(16)), tc, model_spec=model_hparams("lenet5", {"img_size": 16}, 10)
    )
    x = resolve(obs)
    G_W, G_b = x.gradient_surrogate()
    raws = []
    for options, rcond in (({}, 1e-10), ({"rcond": 0.3}, 0.3)):
        res = run_attack("irlg", obs, **options)
        counts, raw = irlg_counts(G_W, G_b, x.W0, x.b0, 16, rcond)
        assert res.info["raw"] == raw.tolist() and res.counts.tolist() == counts.tolist()
        raws.append(raw)
    assert not np.allclose(*raws)
