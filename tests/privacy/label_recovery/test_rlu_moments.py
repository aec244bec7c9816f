"""RLU's logit statistics (``moments.py``), exactly: the auxiliary forward
(logits and the classifier's inputs, BatchNorm with batch statistics of
seeded chunks as in training, or the running ones; the model left as it
was), the per-class Gaussian fits with their ridge, the Monte Carlo ``S`` of
Eq. 8 with common random numbers, and the coefficient matrix of Eq. 9 by
hand. A small BatchNorm model stands in so that the two ``bn_stats`` modes
differ.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from osfl.errors import DataError
from osfl.privacy.label_recovery.moments import (
    ConfidenceSampler,
    LogitGaussians,
    aux_outputs,
    coefficient_matrix,
    fit_gaussians,
    has_batchnorm,
)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Flatten(1), nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU())
        self.fc = nn.Linear(5, 3)

    def get_classifier(self) -> nn.Module:
        return self.fc

    def forward(self, x):
        return self.fc(self.trunk(x))


IMAGES = torch.randint(
    0, 256, (10, 1, 2, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
)


def test_batch_statistics_of_seeded_chunks_as_in_training():
    model = BNNet().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits, feats = aux_outputs(model, IMAGES, batch_size=4, bn_stats="batch", seed=3)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    ref = BNNet().train()
    want_q, want_e = torch.empty(10, 3), torch.empty(10, 5)
    with torch.no_grad():
        for start in range(0, 10, 4):
            idx = order[start : start + 4]
            e = ref.trunk(IMAGES[idx].float() / 255.0)
            want_e[idx], want_q[idx] = e, ref.fc(e)
    torch.testing.assert_close(logits, want_q.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(feats, want_e.double(), rtol=1e-6, atol=1e-7)
    assert logits.dtype == feats.dtype == torch.float64
    for k, v in model.state_dict().items():  # parameters and running statistics untouched
        if not k.endswith("num_batches_tracked"):  # counted up, unused with momentum set
            assert torch.equal(v, before[k]), k
    assert not model.training and model.trunk[2].momentum == 0.1
    other, _ = aux_outputs(model, IMAGES, batch_size=4, bn_stats="batch", seed=4)
    assert not torch.allclose(other, logits)


def test_running_statistics_are_plain_eval():
    model = BNNet().train()
    with torch.no_grad():
        model.trunk[2].running_mean.fill_(0.3)
    logits, feats = aux_outputs(
        model, IMAGES, transform=lambda x: x.float() / 100.0, bn_stats="running"
    )
    ref = BNNet()
    ref.load_state_dict(model.state_dict())
    ref.eval()
    with torch.no_grad():
        e = ref.trunk(IMAGES.float() / 100.0)
        torch.testing.assert_close(feats, e.double())
        torch.testing.assert_close(logits, ref.fc(e).double())
    assert model.training  # restored
    assert has_batchnorm(model) and not has_batchnorm(nn.Linear(2, 2))


def test_without_batchnorm_both_modes_agree_and_keep_the_order():
    model = nn.Sequential(nn.Flatten(1), nn.Linear(4, 3))
    model.get_classifier = lambda: model[1]
    a, ea = aux_outputs(model, IMAGES, batch_size=3, bn_stats="batch")
    b, _ = aux_outputs(model, IMAGES, batch_size=3, bn_stats="running")
    with torch.no_grad():
        torch.testing.assert_close(a, model(IMAGES.float() / 255.0).double())
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(ea, (IMAGES.float() / 255.0).flatten(1).double())


def test_auxiliary_forward_refusals():
    model = BNNet()
    with pytest.raises(DataError) as e:
        aux_outputs(model, IMAGES, bn_stats="train")
    assert str(e.value) == "bn_stats must be 'batch' or 'running', got 'train'"
    with pytest.raises(DataError) as e:
        aux_outputs(model, IMAGES[:0])
    assert str(e.value) == "the auxiliary set is empty"
    with pytest.raises(DataError) as e:
        aux_outputs(model, torch.zeros(2, 1, 3, 3, dtype=torch.uint8), bn_stats="running")
    assert str(e.value).startswith(
        "the observed model cannot read the auxiliary images (after the transform, shape (1, 3, 3), C×H×W): "
    )
    assert str(e.value).endswith(
        "; load the auxiliary set with the run's channels and image size (e.g. load_data(..., channels=3, image_size=32))"
    )
    assert model.trunk[2].momentum == 0.1


# ------------------------------------------------------------------ Gaussians
def test_gaussian_fits_by_class_with_their_ridge():
    q = np.array([[1.0, 0.0], [3.0, 2.0], [0.0, 1.0], [5.0, 5.0], [7.0, 4.0]])
    y = np.array([0, 0, 1, 2, 2])
    q3 = np.hstack([q, np.zeros((5, 1))])
    g = fit_gaussians(q3, y, 3, ridge=1e-3)
    assert g.num_classes == 3 and g.counts.tolist() == [2, 1, 2]
    np.testing.assert_allclose(g.mean, [[2.0, 1.0, 0.0], [0.0, 1.0, 0.0], [6.0, 4.5, 0.0]])
    cov0 = np.cov(q3[:2], rowvar=False)
    eps0 = 1e-3 * np.trace(cov0) / 3
    np.testing.assert_allclose(g.chol[0] @ g.chol[0].T, cov0 + eps0 * np.eye(3), atol=1e-12)
    np.testing.assert_allclose(
        g.chol[1] @ g.chol[1].T, 1e-3 * 1e-12 * np.eye(3), rtol=1e-9
    )  # one sample
    assert np.allclose(np.triu(g.chol[2], 1), 0.0)


def test_gaussian_fit_refusals():
    with pytest.raises(DataError) as e:
        fit_gaussians(np.zeros((4, 3)), np.array([0, 0, 1, 1]), 3)
    assert str(e.value) == (
        "the auxiliary set has no sample of class(es) [2]; RLU needs a few samples of every class"
    )
    for q, y in [
        (np.zeros((4, 2)), np.zeros(4, dtype=int)),
        (np.zeros(4), np.zeros(4, dtype=int)),
        (np.zeros((4, 3)), np.zeros(3, dtype=int)),
    ]:
        with pytest.raises(DataError) as e:
            fit_gaussians(q, y, 3)
        assert str(e.value) == (
            f"fit_gaussians: logits must be (n, 3) with one label each; got {q.shape} and {y.shape}"
        )


# ------------------------------------------------------------------ Monte Carlo S
def test_confidences_are_monte_carlo_with_common_random_numbers():
    mean = np.array([[1.0, 0.0], [0.0, 2.0]])
    chol = np.stack([np.eye(2) * 0.5, np.array([[1.0, 0.0], [0.5, 0.2]])])
    s = ConfidenceSampler(LogitGaussians(mean, chol, np.ones(2)), num_samples=5, seed=7)
    eps = np.random.default_rng(7).standard_normal((2, 5, 2))
    offsets = np.einsum("nmk,nlk->nml", eps, chol)
    np.testing.assert_allclose(s.offsets, offsets, rtol=1e-12)
    q = offsets + mean[:, None, :]
    want = (np.exp(q) / np.exp(q).sum(axis=2, keepdims=True)).mean(axis=1)
    np.testing.assert_allclose(s.S(), want, rtol=1e-12)
    shifted = mean + np.array([[0.0, 3.0], [1.0, 0.0]])
    q = offsets + shifted[:, None, :]
    np.testing.assert_allclose(
        s.S(shifted), (np.exp(q) / np.exp(q).sum(2, keepdims=True)).mean(1), rtol=1e-12
    )
    big = ConfidenceSampler(LogitGaussians(mean * 400, chol, np.ones(2)), num_samples=3).S()
    assert np.isfinite(big).all() and np.allclose(big.sum(axis=1), 1.0)
    with pytest.raises(DataError) as e:
        ConfidenceSampler(LogitGaussians(mean, chol, np.ones(2)), num_samples=0)
    assert str(e.value) == "num_samples (M) must be >= 1, got 0"


def test_coefficient_matrix_by_hand():
    S = np.array([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1], [0.0, 0.5, 0.5]])
    C = coefficient_matrix(S)
    np.testing.assert_allclose(
        C, [[0.3, -0.3, -0.0], [-0.2, 0.4, -0.5], [-0.1, -0.1, 0.5]], atol=1e-15
    )
