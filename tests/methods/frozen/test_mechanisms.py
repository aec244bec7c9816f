"""Mechanism tests of the statistics-based frozen-encoder methods: each fails
when the paper's key component is removed or inverted.

- FedCGS (Guan et al., AAAI 2025): the head is built from the *global*
  statistics: every client's class counts enter it (permuting one client's
  counts changes it), the prior is the global class frequency, and the
  covariance is the total one of all clients' features.
- GH-OFL (Turazza et al., ICLR 2026): QDA uses each class's own covariance
  (it separates classes that differ only in spread, where LDA cannot and NB
  cannot when they differ only in correlation); with equal class covariances,
  or ``pooling = 1``, QDA decides as LDA; Proto-Hyper's distillation pulls
  the student toward its teacher; FisherMix's margin changes what it learns.
- FedPFT (Beitollahi et al., 2024): the client's mixture is fitted to that
  class's features (EM keeps its mean and variance), and the server's
  features are drawn from the uploaded mixture (means, variances and weights
  each move the draws as they should).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from osfl.config import method_config
from osfl.fl.upload import Upload
from osfl.methods.fedcgs import FedCGS, GaussianHead, client_statistics, lda_head
from osfl.methods.fedpft import FedPFT, fit_class_gmm, sample_gmm_rows
from osfl.methods.ghofl import GHOFL, GaussianClassHead, class_moments, gaussian_head
from osfl.methods.ghofl.learned import (
    cosine_logits,
    fisher_gaussians,
    fishermix_head,
    nb_fisher_logits,
    protohyper_head,
)
from support.tiny import blobs, split_ctx

# --------------------------------------------------------------------------- FedCGS


def gaussian_classes(seed: int, n: int = 40, d: int = 4, classes: int = 3) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, d, generator=g, dtype=torch.float64) * 2
    f = torch.cat(
        [means[c] + torch.randn(n, d, generator=g, dtype=torch.float64) for c in range(classes)]
    )
    return f, torch.arange(classes).repeat_interleave(n)


def uploads_of(parts: list[tuple[torch.Tensor, torch.Tensor]], classes: int) -> dict[int, Upload]:
    out = {}
    for i, (f, y) in enumerate(parts):
        st = client_statistics(f, y, classes)
        counts = [int(n) for n in st.pop("class_counts")]
        out[i] = Upload(tensors=st, meta={"num_samples": len(y), "class_counts": counts})
    return out


def test_fedcgs_head_uses_every_clients_class_counts(tiny) -> None:
    """The server's head is the one of all features at once; permuting the
    class counts one client reports (its sums unchanged) changes it."""
    m = FedCGS(method_config(FedCGS), split_ctx(tiny, 2, None, scheme="iid").run)
    f, y = gaussian_classes(0, classes=10)
    half = torch.arange(len(y)) % 3 == 0
    ups = uploads_of([(f[half], y[half]), (f[~half], y[~half])], 10)
    state = m.aggregate(m.init_state(), ups, 0)
    st = client_statistics(f, y, 10)
    w, b = lda_head(st["class_sums"], st["class_counts"], st["second_moment"], shrinkage=1e-4)
    assert torch.allclose(state["weight"], w, rtol=1e-9, atol=1e-9 * float(w.abs().max()))
    assert torch.allclose(state["bias"], b, rtol=1e-9, atol=1e-9)
    counts = list(ups[1].meta["class_counts"])
    counts[0], counts[1] = counts[1], counts[0] + 1
    counts[2] -= 1
    assert counts != ups[1].meta["class_counts"] and sum(counts) == ups[1].meta["num_samples"]
    lying = {0: ups[0], 1: Upload(ups[1].tensors, {**ups[1].meta, "class_counts": counts})}
    other = m.aggregate(m.init_state(), lying, 0)
    assert float((other["weight"] - w).abs().max()) > 1e-3 * float(w.abs().max())
    assert float((other["bias"] - b).abs().max()) > 1e-3


def test_fedcgs_prior_is_the_global_class_frequency() -> None:
    """b_c + ½ μ_cᵀ W_c = log(n_c / N): the log prior of the pooled counts;
    a class with more samples (same features) gets exactly log 2 more."""
    f, y = gaussian_classes(1)
    st = client_statistics(f, y, 3)
    w, b = lda_head(st["class_sums"], st["class_counts"], st["second_moment"], shrinkage=1e-4)
    mu = st["class_sums"] / st["class_counts"][:, None]
    n = st["class_counts"].double()
    assert torch.allclose(b + 0.5 * (mu * w).sum(1), (n / n.sum()).log(), atol=1e-12)
    # class 0 twice (each sample duplicated): the prior ratio doubles
    f2, y2 = torch.cat([f, f[y == 0]]), torch.cat([y, y[y == 0]])
    st2 = client_statistics(f2, y2, 3)
    _, b2 = lda_head(st2["class_sums"], st2["class_counts"], st2["second_moment"], shrinkage=0)
    mu2 = st2["class_sums"] / st2["class_counts"][:, None]
    w2, _ = lda_head(st2["class_sums"], st2["class_counts"], st2["second_moment"], shrinkage=0)
    prior2 = b2 + 0.5 * (mu2 * w2).sum(1)
    assert float(prior2[0] - prior2[1]) == pytest.approx(math.log(2 * 40 / 40), abs=1e-12)


def test_fedcgs_covariance_is_the_total_one() -> None:
    """``total`` (FedCGS): Σ = (B − N μ̄ μ̄ᵀ)/(N − 1), the covariance of all
    features including the spread between class means; ``within`` removes
    it. Both from the same upload, both exact."""
    f, y = gaussian_classes(2)
    st = client_statistics(f, y, 3)
    mu = st["class_sums"] / st["class_counts"][:, None]
    for covariance, sigma in (
        ("total", torch.cov(f.T)),
        ("within", sum((f[y == c] - mu[c]).T @ (f[y == c] - mu[c]) for c in range(3)) / (120 - 3)),
    ):
        w, _ = lda_head(
            st["class_sums"],
            st["class_counts"],
            st["second_moment"],
            shrinkage=0.0,
            covariance=covariance,
        )
        assert torch.allclose(w, torch.linalg.solve(sigma, mu.T).T, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- GH-OFL


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


# --------------------------------------------------------------------------- FedPFT


def test_fedpft_mixture_keeps_the_class_mean_and_variance() -> None:
    """EM's M-step: Σ w_k μ_k is the class's feature mean and Σ w_k (σ²_k +
    μ_k²) − mean² its per-dimension variance (plus ``reg_covar``), whatever
    the components: the upload summarises *that* class's features."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 0.5, (40, 3)), rng.normal(3, 1.5, (25, 3))])
    rows = fit_class_gmm(
        x, 4, seed=1, reg_covar=1e-3, tol=1e-3, max_iter=20, single_variance=np.ones(3)
    )
    w, mu, var = rows[:, 0], rows[:, 1:4], rows[:, 4:]
    mean = w @ mu
    np.testing.assert_allclose(mean, x.mean(0), atol=1e-10)
    np.testing.assert_allclose(w @ (var + mu**2) - mean**2, x.var(0) + 1e-3, rtol=1e-6)


def rows_of(weights: list[float], means: list[list[float]], var: list[list[float]]) -> torch.Tensor:
    return torch.cat(
        [torch.tensor(weights)[:, None], torch.tensor(means), torch.tensor(var)], 1
    ).half()


def test_fedpft_server_draws_move_with_the_uploaded_mixture(tiny) -> None:
    """The same seeds, one class's mixture changed: its means shifted by δ
    shift its draws by exactly δ; its variances ×4 double each draw's offset
    from its component mean; all weight on one component puts every draw
    there. The other classes' draws do not move."""
    ctx = split_ctx(tiny, 1, None, scheme="iid")
    m = FedPFT(method_config(FedPFT), ctx.run)
    base = rows_of([0.5, 0.5], [[-4.0, 0.0], [4.0, 1.0]], [[0.25, 1.0], [1.0, 0.25]])
    other = rows_of([1.0], [[0.0, 9.0]], [[0.5, 0.5]])

    def draws(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        meta = {"num_samples": 900, "class_counts": [0, 0, 0, 600, 0, 0, 300, 0, 0, 0]}
        return m.synthetic_features({0: Upload({"gmm.3": rows, "gmm.6": other}, meta)})

    x, y = draws(base)
    assert np.bincount(y.numpy(), minlength=10).tolist() == [0, 0, 0, 600, 0, 0, 300, 0, 0, 0]
    c3 = y == 3
    shifted = base.clone()
    shifted[:, 1:3] += torch.tensor([1.5, -2.0]).half()
    xs, _ = draws(shifted)
    assert torch.allclose(xs[c3] - x[c3], torch.tensor([1.5, -2.0]), atol=1e-5)
    assert torch.equal(xs[~c3], x[~c3])
    wide = base.clone()
    wide[:, 3:] *= 4
    xw, _ = draws(wide)
    comp = (x[c3, 0] > 0).long()  # the component each draw came from (well separated)
    centre = base[:, 1:3].float()[comp]
    assert torch.allclose(xw[c3] - centre, 2 * (x[c3] - centre), atol=1e-5)
    one = base.clone()
    one[:, 0] = torch.tensor([0.0, 1.0]).half()
    xo, _ = draws(one)
    assert bool((xo[c3, 0] > 0).all())
    assert abs(float(x[c3, 0].gt(0).double().mean()) - 0.5) < 0.1
    # the draws follow each component's variance
    assert abs(float(x[c3][comp == 0, 0].std()) - 0.5) < 0.08
    assert abs(float(x[c3][comp == 1, 1].std()) - 0.5) < 0.08


def test_fedpft_sampling_reads_weights_means_and_variances_from_their_columns() -> None:
    """Rows [weight, mean (D), variance (D)]: a one-component mixture's draws
    have that mean and that variance per dimension."""
    rows = torch.tensor([[1.0, 2.0, -1.0, 0.5, 0.04, 4.0, 1.0]])
    x = sample_gmm_rows(rows, 20000, torch.Generator().manual_seed(0), 1e-6)
    np.testing.assert_allclose(x.mean(0).numpy(), [2.0, -1.0, 0.5], atol=0.05)
    np.testing.assert_allclose(x.var(0).numpy(), [0.04, 4.0, 1.0], rtol=0.05)
