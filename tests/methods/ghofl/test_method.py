"""GH-OFL: each closed-form head (nb, lda, qda) equals a direct scipy/numpy
computation on the pooled features; the heads do not depend on how the data
are split (float64 rounding) and beat chance end to end; the learned heads'
synthetic features follow the law they were drawn from, the heads beat chance,
and with a fixed seed they depend on the data only through the summed
statistics; statistics no features can produce, malformed uploads and bad
options are refused with a clear message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal, norm

from osfl.assembly import SeedContext
from osfl.config import method_config
from osfl.data.federation import Federation
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientContext
from osfl.fl.evaluate import evaluate
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.upload import Upload, validate
from osfl.methods.fedcgs import ABSENT_CLASS_BIAS, GaussianHead
from osfl.methods.frozen import encode_images
from osfl.methods.ghofl import (
    GHOFL,
    MODULES,
    MOMENT_KEYS,
    TRAINERS,
    GaussianClassHead,
    GHOFLConfig,
    class_moments,
    gaussian_head,
    learned_setup,
)
from osfl.methods.ghofl.learned import JITTER, synthetic_gaussians
from support.tiny import blobs, split_ctx

D = 16  # the tiny encoder's token width


# --- the heads against a direct computation -------------------------------------------


def toy(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """2 classes in 3 dimensions with different covariances (and a third,
    absent class), float64."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(9, 3, generator=g, dtype=torch.float64) @ torch.tensor(
        [[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, -0.3, 0.2]], dtype=torch.float64
    )
    b = torch.randn(6, 3, generator=g, dtype=torch.float64) * 0.7 + torch.tensor([1.0, -2.0, 0.5])
    return torch.cat([a, b]), torch.tensor([0] * 9 + [1] * 6)


def scores(head: str, params: dict[str, torch.Tensor], x: torch.Tensor) -> np.ndarray:
    if head == "lda":
        return GaussianHead(params["weight"], params["bias"])(x).numpy()
    return GaussianClassHead(params["mean"], params["whiten"], params["const"])(x).numpy()


def fit(head: str, f: torch.Tensor, y: torch.Tensor, **kw: float) -> dict[str, torch.Tensor]:
    st = class_moments(f, y, 3, head)
    return gaussian_head(head, st["class_sums"], st["class_counts"], st[MOMENT_KEYS[head]], **kw)


@pytest.mark.parametrize(
    "pooling,shrinkage,ridge", [(0.0, 0.0, 0.0), (0.3, 0.1, 0.0), (0.3, 0.05, 0.02)]
)
def test_qda_is_the_gaussian_log_joint_density(
    pooling: float, shrinkage: float, ridge: float
) -> None:
    f, y = toy()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = scores("qda", fit("qda", f, y, shrinkage=shrinkage, pooling=pooling, ridge=ridge), x)
    fx, xx = f.numpy(), x.numpy()
    covs = [np.cov(fx[y == c], rowvar=False) for c in (0, 1)]  # unbiased
    within = sum(np.cov(fx[y == c], rowvar=False) * (n - 1) for c, n in ((0, 9), (1, 6))) / 13
    r = ridge * np.trace(within) / 3
    for c, n in ((0, 9), (1, 6)):
        blend = (1 - pooling) * covs[c] + pooling * within  # RDA, then the authors' shrink
        cov = (1 - shrinkage) * blend + shrinkage * np.trace(blend) / 3 * np.eye(3) + r * np.eye(3)
        want = multivariate_normal(fx[y == c].mean(0), cov).logpdf(xx) + np.log(n / 15)
        np.testing.assert_allclose(got[:, c], want, rtol=1e-10)
    assert (got[:, 2] == ABSENT_CLASS_BIAS).all()  # nobody holds class 2: finite, never argmax


def test_nb_is_the_diagonal_gaussian_log_joint_density() -> None:
    f, y = toy()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = scores("nb", fit("nb", f, y, shrinkage=0.0), x)
    fx, xx = f.numpy(), x.numpy()
    for c, n in ((0, 9), (1, 6)):
        mu, sd = fx[y == c].mean(0), fx[y == c].std(0, ddof=1)
        want = norm(mu, sd).logpdf(xx).sum(1) + np.log(n / 15)
        np.testing.assert_allclose(got[:, c], want, rtol=1e-10)
    assert (got[:, 2] == ABSENT_CLASS_BIAS).all()


@pytest.mark.parametrize("shrinkage", [0.0, 0.05])
def test_lda_is_the_shared_covariance_classifier(shrinkage: float) -> None:
    """Up to a per-sample constant (−½ xᵀΣ⁻¹x − ½ log det Σ), lda's scores
    are log N(x; μ_c, Σ̂) + log π_c with Σ̂ the shrunk pooled within-class Σ_W."""
    f, y = toy()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = scores("lda", fit("lda", f, y, shrinkage=shrinkage), x)
    fx, xx = f.numpy(), x.numpy()
    within = sum(np.cov(fx[y == c], rowvar=False) * (n - 1) for c, n in ((0, 9), (1, 6))) / 13
    within = (1 - shrinkage) * within + shrinkage * np.trace(within) / 3 * np.eye(3)
    want = np.stack(
        [
            multivariate_normal(fx[y == c].mean(0), within).logpdf(xx) + np.log(n / 15)
            for c, n in ((0, 9), (1, 6))
        ],
        1,
    )
    gap = got[:, :2] - want
    np.testing.assert_allclose(gap, gap[:, :1].repeat(2, 1), rtol=1e-10, atol=1e-10)
    assert (got[:, 2] <= -1e29).all()


def test_options_and_singular_covariances() -> None:
    f = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([0, 1, 1])
    for head in ("nb", "lda", "qda"):
        p = fit(head, f, y, shrinkage=0.1)  # D > N: only the ridge makes it solvable
        assert all(bool(torch.isfinite(t).all()) for t in p.values())
    with pytest.raises(ConfigError, match=r"ghofl.*singular.*shrinkage"):
        fit("qda", f, y, shrinkage=0.0)
    with pytest.raises(ConfigError, match=r"ghofl.*singular.*shrinkage"):
        fit("lda", f, y, shrinkage=0.0)
    bad_options = (
        ({"head": "svm"}, "head must be one of nb, lda, qda, fishermix, protohyper"),
        ({"pooling": 1.5}, "pooling"),
        ({"qda_shrinkage": -0.1}, "qda_shrinkage"),
        ({"ridge": -1.0}, "ridge"),
        ({"synthetic_covariance": "diag"}, "synthetic_covariance must be one of class, pooled"),
        ({"fisher_energy": 0.0}, "fisher_energy"),
        ({"kd_alpha": 1.5}, "kd_alpha"),
        ({"teacher_blend": -0.2}, "teacher_blend"),
        ({"protohyper_rank": 0}, "protohyper_rank must be > 0"),
        ({"synthetic_per_class": 0}, "synthetic_per_class"),
        ({"fishermix_margin": -0.1}, "fishermix_margin"),
        ({"fishermix_epochs": -1}, "fishermix_epochs"),
    )
    for bad, words in bad_options:
        with pytest.raises(ConfigError, match=words):
            method_config(GHOFL, bad)


# --- federated runs ----------------------------------------------------------------


def run(ctx: SeedContext, **over: Any) -> tuple[GHOFL, dict[str, Any], float]:
    m = GHOFL(method_config(GHOFL, over), ctx.run)
    res = run_simulation(m, ctx.run, ctx.splits.train, ctx.federation, threads_per_client=1)
    acc = evaluate(m.predictor(res.state), ctx.splits.test, ctx.run.eval_transform).accuracy
    return m, res.state, acc


@pytest.fixture(scope="module")
def splits(tiny: Any) -> list[SeedContext]:
    return [
        split_ctx(tiny, 1, None, scheme="iid"),
        split_ctx(tiny, 3, 0.5),
        split_ctx(tiny, 5, 0.1),
    ]


@pytest.mark.parametrize("head", ["nb", "lda", "qda"])
def test_partition_invariance_and_the_centralised_head(
    head: str, splits: list[SeedContext]
) -> None:
    over = {"head": head, "pooling": 0.3}
    results = [run(ctx, **over) for ctx in splits]
    m, first, _ = results[0]
    keys = ("weight", "bias") if head == "lda" else ("mean", "whiten", "const")
    accs = {acc for *_, acc in results}
    assert len(accs) == 1, f"{head}: accuracy depends on the partition: {accs}"
    for _, state, _ in results[1:]:
        for k in keys:
            scale = float(first[k].abs().max())
            assert torch.allclose(state[k], first[k], rtol=1e-9, atol=1e-9 * scale), (head, k)
    assert accs.pop() > 0.5  # chance is 0.1: random tiny-ViT features still carry the digits

    # centralised: the same head from all training features at once
    ctx = splits[0]
    feats = encode_images(
        m.encoder(),
        ctx.splits.train.images,
        ctx.run.eval_transform,
        m.view_sets(),
        batch_size=64,
        device=torch.device("cpu"),
    )[:, 0]
    st = class_moments(feats, ctx.splits.train.labels, 10, head)
    pooled = gaussian_head(
        head,
        st["class_sums"],
        st["class_counts"],
        st[MOMENT_KEYS[head]],
        shrinkage=m.config.head_shrinkage(),
        pooling=0.3,
    )
    for k in keys:
        scale = float(pooled[k].abs().max())
        assert torch.allclose(first[k], pooled[k], rtol=1e-9, atol=1e-9 * scale), (head, k)
    # what the sites get back evaluates exactly like the server's head
    x = torch.randn(5, D)
    released = m.predictor(m.release(first)).head
    assert torch.equal(released(x), m.predictor(first).head(x))


def test_absent_classes_single_class_client_and_bytes(tiny: Any) -> None:
    _, data = tiny
    labels = data.train.labels.numpy()
    only_4 = np.flatnonzero(labels == 4)
    others = np.flatnonzero((labels != 4) & (labels != 9))  # nobody holds class 9
    fed = Federation.from_indices(
        labels,
        [only_4, others],
        scheme="manual",
        params={},
        seed=0,
        num_classes=10,
        data_fingerprint=data.train.fingerprint(),
    )
    ctx = split_ctx(tiny, 2, None, federation=fed)
    m, state, acc = run(ctx, pooling=0.3)
    assert float(state["const"][9]) == ABSENT_CLASS_BIAS
    assert float(state["whiten"][9].abs().max()) == 0.0
    assert all(bool(torch.isfinite(state[k]).all()) for k in ("mean", "whiten", "const"))
    assert acc > 0.5
    rep = m.report(state)
    assert rep["bytes_up"]["0"]["statistics"] == (10 * D + 10 * D * D) * 8  # QDA: C·D + C·D²
    assert rep["gflops_per_sample"] is None and rep["head"] == "qda"
    assert (GHOFL.card.regime, GHOFL.card.uploads) == ("frozen_encoder", "statistics")


# --- refused uploads -----------------------------------------------------------------


def client_upload(tiny: Any, head: str) -> tuple[GHOFL, Upload]:
    ctx = split_ctx(tiny, 3, 0.5)
    m = GHOFL(method_config(GHOFL, {"head": head}), ctx.run)
    data = ctx.splits.train.subset(ctx.federation.client_indices[1].copy())
    up = m.client_update(
        ClientContext(ctx.run, 1, 0, torch.Generator()), m.broadcast(m.init_state(), 0), data
    )
    return m, up


@pytest.mark.parametrize("head", ["nb", "lda", "qda"])
def test_malformed_uploads_are_refused_naming_client_and_field(tiny: Any, head: str) -> None:
    m, good = client_upload(tiny, head)
    spec = m.upload_spec({}, 0, 1)
    validate(Upload.from_bytes(good.to_bytes()), spec, client=1)
    assert m.screen({}, 0, 1, good) is None
    key = MOMENT_KEYS[head]
    assert all(t.dtype == torch.float64 for t in good.tensors.values())
    moment = good.tensors[key]
    nan = good.tensors["class_sums"].clone()
    nan[0, 0] = float("nan")
    cases = [
        ("class_sums", good.tensors["class_sums"].float(), "dtype"),
        ("class_sums", nan, "NaN"),
        (key, torch.zeros(*moment.shape[:-1], moment.shape[-1] - 1, dtype=torch.float64), "shape"),
    ]
    for name, bad, words in cases:
        with pytest.raises(UploadError, match=rf"client 1.*{name}.*{words}"):
            validate(Upload(tensors={**good.tensors, name: bad}, meta=good.meta), spec, client=1)
    counts = good.meta["class_counts"]
    for wrong, words in ((counts[:-1], "items"), ([counts[0] + 1, *counts[1:]], "sums to")):
        with pytest.raises(UploadError, match=rf"meta\.class_counts.*{words}"):
            validate(Upload(good.tensors, dict(good.meta, class_counts=wrong)), spec, client=1)
    with pytest.raises(UploadError, match="unexpected"):
        other = "second_moment" if head != "lda" else "class_second_moments"
        validate(Upload({**good.tensors, other: moment}, good.meta), spec, client=1)


@pytest.mark.parametrize("head", ["nb", "lda", "qda"])
def test_statistics_no_features_can_produce_are_screened_out(tiny: Any, head: str) -> None:
    """Valid shapes, impossible values: refused before the server's solve."""
    m, good = client_upload(tiny, head)
    key = MOMENT_KEYS[head]
    sums, moment = good.tensors["class_sums"], good.tensors[key]
    counts = good.meta["class_counts"]
    held = next(c for c, n in enumerate(counts) if n >= 2)
    cases: dict[str, dict[str, torch.Tensor]] = {"beyond": {"class_sums": sums * 1e200}}
    if head == "nb":  # Σ f² below (Σ f)²/n_c: a negative variance
        neg = moment.clone()
        neg[held, 3] = 0.5 * sums[held, 3] ** 2 / counts[held]
        cases["negative variance"] = {key: neg}
    else:  # a second moment whose class scatter is not PSD, and an asymmetric one
        low, asym = moment.clone(), moment.clone()
        if head == "qda":
            low[held] *= 1e-3
            asym[held, 0, 1] += 1.0
        else:
            low *= 1e-3
            asym[0, 1] += 1.0
        cases["smaller than the class sums allow"] = {key: low}
        cases["not symmetric"] = {key: asym}
    if 0 in counts:
        absent = counts.index(0)
        ghost_sum, ghost_moment = sums.clone(), moment.clone()
        ghost_sum[absent] = 1.0
        cases["no samples"] = {"class_sums": ghost_sum}
        if head != "lda":
            ghost_moment[absent] = 1.0
            cases["nonzero moment for a class with no samples"] = {key: ghost_moment}
    for words, change in cases.items():
        why = m.screen({}, 0, 1, Upload({**good.tensors, **change}, good.meta))
        assert why is not None and words in why, (head, words, why)
    # a lone client whose features are all equal: a degenerate but finite head
    zero = Upload({k: torch.zeros_like(v) for k, v in good.tensors.items()}, good.meta)
    assert m.screen({}, 0, 1, zero) is None
    state = m.aggregate(m.init_state(), {1: zero}, 0)
    keys = ("weight", "bias") if head == "lda" else ("mean", "whiten", "const")
    assert all(bool(torch.isfinite(state[k]).all()) for k in keys)


# --- the learned heads (FisherMix, Proto-Hyper) ------------------------------------------


SMALL = {
    "synthetic_per_class": 400,
    "fishermix_epochs": 8,
    "protohyper_epochs": 8,
    "fishermix_batch_size": 256,
    "protohyper_batch_size": 256,
}


def test_synthetic_features_follow_the_statistics() -> None:
    """The Fisher projection whitens the shrunk pooled covariance and solves
    S_B v = λ S_W v; each class's synthetic features have the mean μ_c V and
    covariance τ² (Vᵀ shrink(Σ_c) V + εI) + εI computed here from numpy."""
    f, y = blobs(0, 300)
    st = class_moments(f, y, 5, "qda")  # class 4: absent
    cfg = GHOFLConfig(head="fishermix", synthetic_per_class=20000, fisher_max_dim=8)
    setup, _ = learned_setup(
        st["class_sums"], st["class_counts"], st["class_second_moments"], cfg, seed=3
    )
    fx, v = f.numpy(), setup.projection.numpy()
    k = v.shape[1]
    assert setup.present.tolist() == [True] * 4 + [False] and 2 <= k <= 3  # rank S_B ≤ K − 1
    within = sum(np.cov(fx[y == c], rowvar=False) * 299 for c in range(4)) / (1200 - 4)
    sw = 0.95 * within + 0.05 * np.trace(within) / 6 * np.eye(6) + JITTER * np.eye(6)
    np.testing.assert_allclose(v.T @ sw @ v, np.eye(k), atol=1e-8)  # whitened
    mbar = fx.mean(0)  # priors are n_c / N: equal classes, the plain mean
    sb = sum(
        0.25 * np.outer(fx[y == c].mean(0) - mbar, fx[y == c].mean(0) - mbar) for c in range(4)
    )
    lam = np.diag(v.T @ sb @ v)
    np.testing.assert_allclose(sb @ v, sw @ v * lam, atol=1e-8)  # generalised eigenvectors
    z, labels = setup.features.numpy(), setup.labels.numpy()
    assert z.shape == (4 * 20000, k) and np.isfinite(z).all()
    for c in range(4):
        own = np.cov(fx[y == c], rowvar=False)
        shrunk = 0.95 * own + 0.05 * np.trace(own) / 6 * np.eye(6)
        law = 0.81 * (v.T @ shrunk @ v + JITTER * np.eye(k)) + JITTER * np.eye(k)
        zc = z[labels == c]
        sd = np.sqrt(np.diag(law))
        assert (np.abs(zc.mean(0) - fx[y == c].mean(0) @ v) < 5 * sd / np.sqrt(20000)).all()
        np.testing.assert_allclose(np.cov(zc, rowvar=False), law, atol=0.04 * sd.max() ** 2)
    # "pooled": every class follows the same (shrunk pooled) covariance
    mu, cov = synthetic_gaussians(
        setup.mean,
        torch.zeros(4, 6, 6, dtype=torch.float64),
        setup.pooled,
        setup.projection,
        covariance="pooled",
        shrinkage=0.0,
        scale=1.0,
    )
    np.testing.assert_allclose(cov[0].numpy(), cov[3].numpy())
    np.testing.assert_allclose(mu.numpy(), setup.mean.numpy() @ v)


@pytest.mark.parametrize("head", ["fishermix", "protohyper"])
def test_learned_heads_beat_chance_and_the_shapes(head: str) -> None:
    f, y = blobs(1, 200)
    st = class_moments(f, y, 5, "qda")
    cfg = method_config(GHOFL, {"head": head, **SMALL})
    setup, gen = learned_setup(
        st["class_sums"], st["class_counts"], st["class_second_moments"], cfg, seed=0
    )
    params = TRAINERS[head](setup, gen, cfg)
    keys, build = MODULES[head]
    assert set(keys) <= set(params)
    assert all(bool(torch.isfinite(params[k]).all()) for k in keys)
    test_f, test_y = blobs(2, 300)
    logits = build(*(params[k] for k in keys))(test_f)
    assert logits.shape == (1200, 5) and bool(torch.isfinite(logits).all())
    acc = float((logits.argmax(1) == test_y).double().mean())
    assert acc > 0.65, acc  # chance: 0.25 (class 4 is absent and never predicted)
    assert (logits.argmax(1) != 4).all()
    # as good as the closed-form linear head (the Fisher subspace keeps ≤ K − 1
    # directions, so covariance differences that QDA exploits are mostly lost)
    lda_st = class_moments(f, y, 5, "lda")
    lda = gaussian_head(
        "lda", lda_st["class_sums"], lda_st["class_counts"], lda_st["second_moment"], shrinkage=0.05
    )
    lda_acc = float(
        (torch.from_numpy(scores("lda", lda, test_f)).argmax(1) == test_y).double().mean()
    )
    assert acc > lda_acc - 0.05, (acc, lda_acc)


@pytest.mark.parametrize("head", ["fishermix", "protohyper"])
def test_learned_heads_depend_on_the_data_only_through_the_sums(
    head: str, splits: list[SeedContext]
) -> None:
    """Two partitions of the same data (iid, Dirichlet 0.1), the same run
    seed: the same synthetic features (the summed statistics agree to float64
    rounding) and so the same trained head and accuracy."""
    over = {"head": head, **SMALL, "fishermix_epochs": 40, "protohyper_epochs": 40}
    (m, first, acc0), (_, other, acc1) = (run(ctx, **over) for ctx in (splits[0], splits[2]))
    keys, _ = MODULES[head]
    for k in keys:
        scale = float(first[k].abs().max())
        assert torch.allclose(other[k], first[k], rtol=1e-6, atol=1e-6 * scale), (head, k)
    assert acc0 == acc1 and acc0 > 0.4, (acc0, acc1)  # chance 0.1
    rep = m.report(first)
    assert rep["head"] == head and 2 <= rep["fisher_dim"] <= 16
    assert rep["bytes_up"]["0"]["statistics"] > 10 * D * D * 8  # per-class second moments
    x = torch.randn(5, D)
    assert torch.equal(m.predictor(m.release(first)).head(x), m.predictor(first).head(x))
