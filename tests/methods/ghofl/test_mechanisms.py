"""Mechanism tests of GH-OFL (Turazza et al., ICLR 2026), each failing when the
paper's key component is removed or inverted: QDA uses each class's own
covariance (it separates classes that differ only in spread, where LDA cannot
and NB cannot when they differ only in correlation); with equal class
covariances, or ``pooling = 1``, QDA decides as LDA; Proto-Hyper's
distillation pulls the student toward its teacher; FisherMix's margin
changes what it learns."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from osfl.config import method_config
from osfl.methods.fedcgs import GaussianHead
from osfl.methods.ghofl import GHOFL, GaussianClassHead, class_moments, gaussian_head
from osfl.methods.ghofl.learned import (
    cosine_logits,
    fisher_gaussians,
    fishermix_head,
    nb_fisher_logits,
    protohyper_head,
)
from support.tiny import blobs


def heads_scores(
    f: torch.Tensor, y: torch.Tensor, x: torch.Tensor, classes: int, **kw: Any
) -> dict[str, torch.Tensor]:
    out = {}
    for head in ("nb", "lda", "qda"):
        st = class_moments(f, y, classes, head)
        moment = st[
            {"nb": "class_squares", "lda": "second_moment", "qda": "class_second_moments"}[head]
        ]
        p = gaussian_head(head, st["class_sums"], st["class_counts"], moment, **kw)
        module = (
            GaussianHead(p["weight"], p["bias"])
            if head == "lda"
            else GaussianClassHead(p["mean"], p["whiten"], p["const"])
        )
        out[head] = module(x)
    return out


def spread_classes(seed: int, n: int, correlated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes with the same mean (0): ``correlated=False``: one tight
    (sd 0.3), one wide (sd 3); ``True``: the same variances, correlation +0.95
    in one class and −0.95 in the other."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(2, n, 2, generator=g, dtype=torch.float64)
    if correlated:
        a = torch.tensor([[1.0, 0.95], [0.0, math.sqrt(1 - 0.95**2)]], dtype=torch.float64)
        b = torch.tensor([[1.0, -0.95], [0.0, math.sqrt(1 - 0.95**2)]], dtype=torch.float64)
        f = torch.cat([z[0] @ a, z[1] @ b])
    else:
        f = torch.cat([0.3 * z[0], 3.0 * z[1]])
    return f, torch.arange(2).repeat_interleave(n)


def accuracy(scores: torch.Tensor, y: torch.Tensor) -> float:
    return float((scores.argmax(1) == y).double().mean())


def test_ghofl_qda_uses_each_class_covariance() -> None:
    """Equal means, different spread: QDA separates the classes, LDA (one
    pooled covariance, equal means) cannot. Equal variances, opposite
    correlation: QDA separates them, NB (diagonal) cannot."""
    f, y = spread_classes(0, 300, correlated=False)
    x, xy = spread_classes(1, 300, correlated=False)
    s = heads_scores(f, y, x, 2, shrinkage=0.0)
    assert accuracy(s["qda"], xy) > 0.9 and accuracy(s["nb"], xy) > 0.9
    assert accuracy(s["lda"], xy) < 0.6
    f, y = spread_classes(2, 300, correlated=True)
    x, xy = spread_classes(3, 300, correlated=True)
    s = heads_scores(f, y, x, 2, shrinkage=0.0)
    assert accuracy(s["qda"], xy) > 0.85
    assert accuracy(s["nb"], xy) < 0.6 and accuracy(s["lda"], xy) < 0.6


def test_ghofl_qda_with_equal_class_covariances_decides_as_lda() -> None:
    """Every class the same centred samples around its own mean (so Σ_c = Σ_W
    for all c): QDA's score differences between classes are LDA's, exactly."""
    g = torch.Generator().manual_seed(4)
    base = torch.randn(25, 3, generator=g, dtype=torch.float64) @ torch.tensor(
        [[1.0, 0.4, 0.0], [0.0, 0.8, -0.3], [0.0, 0.0, 0.5]], dtype=torch.float64
    )
    base = base - base.mean(0)
    means = torch.tensor([[0.0, 0.0, 0.0], [1.0, -0.5, 0.3], [-0.7, 0.6, 0.9]], dtype=torch.float64)
    f = torch.cat([base + m for m in means])
    y = torch.arange(3).repeat_interleave(25)
    x = torch.randn(9, 3, generator=g, dtype=torch.float64)
    s = heads_scores(f, y, x, 3, shrinkage=0.1)
    dq, dl = s["qda"] - s["qda"][:, :1], s["lda"] - s["lda"][:, :1]
    assert torch.allclose(dq, dl, atol=1e-9)


def test_ghofl_full_pooling_turns_qda_into_lda() -> None:
    """``pooling = 1`` replaces each Σ_c by Σ_W: QDA's score differences are
    then LDA's (same shrinkage and ridge); at ``pooling = 0`` they are not."""
    f, y = blobs(0, 60, classes=3, dim=4)
    x, _ = blobs(1, 5, classes=3, dim=4)
    for pooling, same in ((1.0, True), (0.0, False)):
        s = heads_scores(f, y, x, 3, shrinkage=0.05, ridge=0.01, pooling=pooling)
        dq, dl = s["qda"] - s["qda"][:, :1], s["lda"] - s["lda"][:, :1]
        assert torch.allclose(dq, dl, atol=1e-9) == same, pooling


def learned(head: str, **over: Any) -> tuple[Any, Any, Any]:
    from osfl.methods.ghofl import learned_setup

    f, y = blobs(3, 150, classes=3, dim=5)
    st = class_moments(f, y, 3, "qda")
    cfg = method_config(
        GHOFL, {"head": head, "synthetic_per_class": 300, "fisher_max_dim": 4, **over}
    )
    setup, gen = learned_setup(
        st["class_sums"], st["class_counts"], st["class_second_moments"], cfg, seed=0
    )
    return setup, gen, cfg


def protohyper(kd_alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(student logits, NB_f base logits) on the synthetic features, trained
    with the teacher NB_f itself (``teacher_blend = 0``)."""
    setup, gen, cfg = learned("protohyper")
    p = protohyper_head(
        setup,
        shrinkage=cfg.shrinkage,
        rank=4,
        teacher_blend=0.0,
        kd_alpha=kd_alpha,
        temperature=1.0,
        epochs=30,
        batch_size=100,
        lr=0.02,
        weight_decay=0.0,
        generator=gen,
    )
    z = setup.features
    g = fisher_gaussians(setup, cfg.shrinkage)
    base = nb_fisher_logits(z, g["mean"], setup.log_prior, g["sigma2"])
    student = base + (z @ p["down"].T) @ p["up"].T + p["bias"]
    return student, base


def test_ghofl_protohyper_distils_from_its_teacher() -> None:
    """Teacher = NB_f = the student's base (``teacher_blend = 0``): pure
    distillation (α = 1) keeps the student's class posteriors at the
    teacher's; cross-entropy alone (α = 0) moves them away, to the labels."""

    def kl(student: torch.Tensor, base: torch.Tensor) -> float:
        p = F.softmax(base, 1)
        return float((p * (F.log_softmax(base, 1) - F.log_softmax(student, 1))).sum(1).mean())

    distilled, base = protohyper(1.0)
    labelled, _ = protohyper(0.0)
    assert kl(distilled, base) < 1e-4 and kl(labelled, base) > 1e-3


def test_ghofl_fishermix_margin_is_trained_in() -> None:
    """CosFace margin m: the prototypes trained with m = 0.3 leave a larger
    cosine gap between the true class and the runner-up than m = 0."""
    gaps = []
    for margin in (0.0, 0.3):
        setup, gen, cfg = learned("fishermix")
        p = fishermix_head(
            setup,
            scale=cfg.fishermix_scale,
            margin=margin,
            epochs=15,
            batch_size=300,
            lr=0.01,
            weight_decay=0.0,
            generator=gen,
        )
        cos = cosine_logits(setup.features, p["weight"], 1.0)
        true = cos.gather(1, setup.labels[:, None]).squeeze(1)
        rival = cos.scatter(1, setup.labels[:, None], -2.0).amax(1)
        gaps.append(float((true - rival).mean()))
    assert gaps[1] > gaps[0] + 0.05, gaps
