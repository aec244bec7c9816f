"""FAFI's SALT losses (Eq. 4, Eq. 5, the separation extra) against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from osfl.errors import ConfigError
from osfl.methods.fafi.losses import (
    contrastive_loss,
    prototype_loss,
    prototype_separation_loss,
)

E = math.e


def _views() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Two samples of different classes; both views of a sample coincide.
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    return z, z.clone(), torch.tensor([0, 1])


def test_contrastive_negatives_denominator_by_hand() -> None:
    # Anchor (1,0): positive = its other view (cos 1); negatives = the two (0,1) (cos 0).
    # -(1/tau - log(2 e^0)) with tau = 1 -> log 2 - 1, the same for all four anchors.
    z1, z2, y = _views()
    loss = contrastive_loss(z1, z2, y, tau=1.0, denominator="negatives")
    assert loss.item() == pytest.approx(math.log(2) - 1, abs=1e-6)


def test_contrastive_all_denominator_by_hand() -> None:
    # SupCon: the denominator also holds the positive -> log(e + 2) - 1.
    z1, z2, y = _views()
    loss = contrastive_loss(z1, z2, y, tau=1.0, denominator="all")
    assert loss.item() == pytest.approx(math.log(E + 2) - 1, abs=1e-6)


def test_contrastive_temperature_and_scale_invariance() -> None:
    # tau = 0.5 doubles the logits: log(2) - 2 (negatives form); feature norms do not matter.
    z1, z2, y = _views()
    loss = contrastive_loss(3 * z1, 0.5 * z2, y, tau=0.5)
    assert loss.item() == pytest.approx(math.log(2) - 2, abs=1e-6)


def test_contrastive_supervised_positives_by_hand() -> None:
    # Three samples, labels (0, 0, 1), all views identical per sample:
    # a = (1,0), b = (0,1) share label 0, c = (-1,0) has label 1. tau = 1, "all" denominator.
    a, b, c = [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]
    z = torch.tensor([a, b, c])
    y = torch.tensor([0, 0, 1])
    loss = contrastive_loss(z, z.clone(), y, tau=1.0, denominator="all")
    # anchor a: others a'(1), b(0), b'(0), c(-1), c'(-1); positives a', b, b'.
    lse_a = math.log(E + 2 + 2 / E)
    la = lse_a - (1 + 0 + 0) / 3
    # anchor b: others b'(1), a(0), a'(0), c(0), c'(0); positives b', a, a'.
    lse_b = math.log(E + 4)
    lb = lse_b - 1 / 3
    # anchor c: others c'(1), a(-1), a'(-1), b(0), b'(0); positive c'.
    lc = math.log(E + 2 / E + 2) - 1
    expected = (2 * la + 2 * lb + 2 * lc) / 6
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_contrastive_unsupervised_is_nt_xent() -> None:
    # labels=None: only the other view is positive. Two orthogonal samples, tau = 1,
    # "all": -(1 - log(e + 2)) as in the supervised case with distinct labels.
    z1, z2, _ = _views()
    sup = contrastive_loss(z1, z2, torch.tensor([0, 1]), tau=1.0, denominator="all")
    unsup = contrastive_loss(z1, z2, None, tau=1.0, denominator="all")
    assert unsup.item() == pytest.approx(sup.item(), abs=1e-6)


def test_contrastive_one_class_batch_negatives_is_zero_with_graph() -> None:
    z1 = torch.randn(4, 3, requires_grad=True)
    loss = contrastive_loss(z1, torch.randn(4, 3), torch.zeros(4, dtype=torch.long))
    assert loss.item() == 0.0
    loss.backward()  # still differentiable
    assert z1.grad is not None and torch.all(z1.grad == 0)


def test_contrastive_gradient_pulls_positives_together() -> None:
    torch.manual_seed(0)
    z1 = torch.randn(6, 4, requires_grad=True)
    z2 = torch.randn(6, 4)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    opt = torch.optim.SGD([z1], lr=0.5)
    first = contrastive_loss(z1, z2, y).item()
    for _ in range(50):
        opt.zero_grad()
        loss = contrastive_loss(z1, z2, y)
        loss.backward()
        opt.step()
    assert math.isfinite(first) and loss.item() < first


def test_contrastive_refuses_bad_inputs() -> None:
    z = torch.randn(3, 2)
    with pytest.raises(ConfigError, match="ssl_denominator"):
        contrastive_loss(z, z, denominator="some")
    with pytest.raises(ValueError, match="B×D"):
        contrastive_loss(z, torch.randn(4, 2))
    with pytest.raises(ValueError, match="labels"):
        contrastive_loss(z, z, torch.tensor([0, 1]))


def test_prototype_loss_by_hand() -> None:
    # f = (1,0); prototypes (1,0), (0,1), (-1,0); label 0; tau = 1 -> cosines 1, 0, -1.
    f = torch.tensor([[1.0, 0.0]])
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0]])  # norms do not matter (cosine)
    y = torch.tensor([0])
    neg = prototype_loss(f, p, y, tau=1.0, denominator="negatives")
    assert neg.item() == pytest.approx(math.log(1 + 1 / E) - 1, abs=1e-6)
    full = prototype_loss(f, p, y, tau=1.0, denominator="all")
    assert full.item() == pytest.approx(math.log(E + 1 + 1 / E) - 1, abs=1e-6)
    # tau = 0.5 and a second sample of label 2 (cosines -1, 0, 1 -> the mirror image).
    f2 = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    two = prototype_loss(f2, p, torch.tensor([0, 2]), tau=0.5)
    assert two.item() == pytest.approx(math.log(1 + E**-2) - 2, abs=1e-6)


def test_prototype_loss_dot_matches_cross_entropy() -> None:
    f = torch.randn(5, 3)
    p = torch.randn(4, 3)
    y = torch.tensor([0, 1, 2, 3, 0])
    got = prototype_loss(f, p, y, tau=0.5, denominator="all", similarity="dot")
    want = torch.nn.functional.cross_entropy(f @ p.T / 0.5, y)
    assert got.item() == pytest.approx(want.item(), abs=1e-5)


def test_prototype_loss_refuses_unbounded_and_one_class() -> None:
    with pytest.raises(ConfigError, match="unbounded"):
        prototype_loss(torch.randn(2, 3), torch.randn(3, 3), torch.tensor([0, 1]), similarity="dot")
    with pytest.raises(ConfigError, match="2 classes"):
        prototype_loss(torch.randn(2, 3), torch.randn(1, 3), torch.tensor([0, 0]))


def test_prototype_separation_by_hand() -> None:
    # Orthogonal prototypes, tau = 1: each row -(1 - log(e + 1)) = log(1 + e) - 1.
    p = torch.eye(2)
    assert prototype_separation_loss(p, tau=1.0).item() == pytest.approx(
        math.log(1 + E) - 1, abs=1e-6
    )
    # Opposite prototypes separate better than orthogonal ones.
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert prototype_separation_loss(opposite, tau=1.0).item() == pytest.approx(
        math.log(1 + E**-2), abs=1e-6
    )
