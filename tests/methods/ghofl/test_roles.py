"""GH-OFL roles and directions in the learned heads' losses, at their
initial parameters, against the formulas of the package docstring.

``_train`` is replaced by a spy that keeps the loss closure and the
parameters it would optimise, so each loss is evaluated exactly once on a
hand-built setup (Fisher projection V = I, Σ_W = diag(1, 4), two classes in
k = 2 dimensions) and compared with the same loss written out here:

- FisherMix: CE of s·(cos(z, w_c) − m·[c = y]) (a CosFace margin is
  *subtracted* from the true class);
- Proto-Hyper: α T² KL(teacher_T ‖ student_T) + (1 − α) CE with the teacher
  β·LDA_f + (1 − β)·NB_f and the student NB_f + B A z + b.

Each role is distinguishable: LDA_f and NB_f differ on these features, the
teacher is not symmetric in (teacher, student), and the margin's sign moves
the loss.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from osfl.methods.ghofl import learned
from osfl.methods.ghofl.closed_form import GaussianClassHead
from osfl.methods.ghofl.learned import (
    JITTER,
    FisherMixHead,
    LearnedSetup,
    ProtoHyperHead,
    fishermix_head,
    protohyper_head,
)

Z = torch.tensor([[1.0, 0.5], [-0.5, 2.0], [2.5, -1.0], [0.0, 0.3]], dtype=torch.float64)
Y = torch.tensor([0, 1, 0, 1])
MEAN = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
LOG_PRIOR = torch.tensor([0.25, 0.75], dtype=torch.float64).log()
POOLED = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))


def setup() -> LearnedSetup:
    eye = torch.eye(2, dtype=torch.float64)
    return LearnedSetup(torch.tensor([True, True]), eye, MEAN, LOG_PRIOR, POOLED, Z, Y)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_train(params: list[torch.Tensor], loss_fn: Any, n: int, **_: Any) -> None:
        seen["params"] = [p.detach().clone() for p in params]
        seen["loss"] = float(loss_fn(torch.arange(n)).detach())

    monkeypatch.setattr(learned, "_train", fake_train)
    return seen


def test_fishermix_subtracts_the_margin_from_the_true_class(spy: dict[str, Any]) -> None:
    fishermix_head(
        setup(),
        scale=4.0,
        margin=0.2,
        epochs=1,
        batch_size=4,
        lr=0.1,
        weight_decay=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    (w,) = spy["params"]
    cos = F.normalize(Z, dim=1) @ F.normalize(w, dim=1).T
    onehot = F.one_hot(Y, 2).double()
    want = F.cross_entropy(4.0 * (cos - 0.2 * onehot), Y)
    assert spy["loss"] == pytest.approx(float(want), rel=1e-12)
    plus = F.cross_entropy(4.0 * (cos + 0.2 * onehot), Y)
    assert abs(float(plus) - float(want)) > 0.05  # the sign matters on this setup


def test_protohyper_distils_the_blended_teacher_into_the_nb_student(spy: dict[str, Any]) -> None:
    beta, alpha, t = 0.7, 0.5, 2.0
    protohyper_head(
        setup(),
        shrinkage=0.0,
        rank=1,
        teacher_blend=beta,
        kd_alpha=alpha,
        temperature=t,
        epochs=1,
        batch_size=4,
        lr=0.1,
        weight_decay=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    down, up, bias = spy["params"]
    # Σ_f = V^T shrink(Σ_W, 0) V + εI = diag(1, 4) + εI; LDA_f solves with one more ε;
    # NB_f's spherical σ² = tr Σ_f / k
    diag = torch.tensor([1.0, 4.0], dtype=torch.float64) + JITTER
    w = MEAN.T / (diag + JITTER)[:, None]
    lda = Z @ w - 0.5 * (MEAN * w.T).sum(1) + LOG_PRIOR
    var = float(diag.sum()) / 2
    dist = ((Z[:, None, :] - MEAN[None]) ** 2).sum(-1)
    nb = LOG_PRIOR - 0.5 * dist / var - 0.5 * 2 * math.log(var)
    teacher = beta * lda + (1 - beta) * nb
    student = nb + (Z @ down.T) @ up.T + bias
    p_t = F.softmax(teacher / t, dim=1)
    kl = (p_t * (p_t.log() - F.log_softmax(student / t, dim=1))).sum(1).mean()
    want = alpha * t**2 * kl + (1 - alpha) * F.cross_entropy(student, Y)
    assert spy["loss"] == pytest.approx(float(want), rel=1e-10)
    # the two teachers and the two KL directions are distinguishable here
    assert float((F.softmax(lda / t, 1) - F.softmax(nb / t, 1)).abs().max()) > 0.05


def test_every_head_reads_the_global_token() -> None:
    """Token 0 is the global feature the statistics describe; the patch
    tokens here are far away, so reading any of them changes the scores."""
    tokens = torch.tensor([[[1.0, 0.5], [40.0, -30.0], [-9.0, 7.0]]], dtype=torch.float64)
    f = tokens[:, 0]
    eye = torch.eye(2, dtype=torch.float64)
    gauss = GaussianClassHead(MEAN, torch.ones(2, 2, dtype=torch.float64), LOG_PRIOR)
    want = LOG_PRIOR - 0.5 * ((f[:, None, :] - MEAN[None]) ** 2).sum(-1)
    torch.testing.assert_close(gauss(tokens), want, rtol=0, atol=1e-12)
    full = GaussianClassHead(MEAN, eye.expand(2, 2, 2).clone(), LOG_PRIOR)
    torch.testing.assert_close(full(tokens), want, rtol=0, atol=1e-12)
    weight = torch.tensor([[1.0, 1.0], [-1.0, 2.0]], dtype=torch.float64)
    fm = FisherMixHead(eye, weight, torch.zeros(2, dtype=torch.float64), torch.tensor(10.0))
    cos = F.normalize(f, dim=1) @ F.normalize(weight, dim=1).T
    torch.testing.assert_close(fm(tokens), 10.0 * cos, rtol=0, atol=1e-12)
    zero = torch.zeros(1, 2, dtype=torch.float64)
    ph = ProtoHyperHead(
        eye, MEAN, LOG_PRIOR, torch.tensor(1.0), zero, torch.zeros(2, 1), torch.zeros(2)
    )
    nb = LOG_PRIOR - 0.5 * ((f[:, None, :] - MEAN[None]) ** 2).sum(-1)
    torch.testing.assert_close(ph(tokens), nb, rtol=0, atol=1e-12)
