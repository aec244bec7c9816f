"""GH-OFL: each closed-form head (nb, lda, qda) equals a direct scipy/numpy
computation on the pooled features; the heads do not depend on how the data
are split (float64 rounding) and beat chance end to end; statistics no
features can produce, and malformed uploads, are refused with a clear message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal, norm

from osfl.assembly import SeedContext, load_splits
from osfl.config import load_config, method_config
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
    MOMENT_KEYS,
    GaussianClassHead,
    class_moments,
    gaussian_head,
)
from test_fedcgs import seed_ctx

TINY = [
    "data.image_size=16",
    "data.max_per_class=15",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.min_partition_size=3",
    "progress=false",
    "cache_dir=null",
]
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


@pytest.mark.parametrize("pooling,shrinkage", [(0.0, 0.0), (0.3, 0.05)])
def test_qda_is_the_gaussian_log_joint_density(pooling: float, shrinkage: float) -> None:
    f, y = toy()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = scores("qda", fit("qda", f, y, shrinkage=shrinkage, pooling=pooling), x)
    fx, xx = f.numpy(), x.numpy()
    covs = [np.cov(fx[y == c], rowvar=False) for c in (0, 1)]  # unbiased
    within = sum(np.cov(fx[y == c], rowvar=False) * (n - 1) for c, n in ((0, 9), (1, 6))) / 13
    ridge = shrinkage * np.trace(within) / 3
    for c, n in ((0, 9), (1, 6)):
        cov = (1 - pooling) * covs[c] + pooling * within + ridge * np.eye(3)
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


def test_lda_is_the_shared_covariance_classifier() -> None:
    """Up to a per-sample constant (−½ xᵀΣ⁻¹x − ½ log det Σ), lda's scores
    are log N(x; μ_c, Σ_W) + log π_c with the pooled within-class Σ_W."""
    f, y = toy()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = scores("lda", fit("lda", f, y, shrinkage=0.0), x)
    fx, xx = f.numpy(), x.numpy()
    within = sum(np.cov(fx[y == c], rowvar=False) * (n - 1) for c, n in ((0, 9), (1, 6))) / 13
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
    for bad, words in (({"head": "svm"}, "head"), ({"pooling": 1.5}, "pooling")):
        with pytest.raises(ConfigError, match=words):
            method_config(GHOFL, bad)


# --- federated runs ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    cfg = load_config(None, TINY)
    return cfg, load_splits(cfg)




def run(ctx: SeedContext, **over: Any) -> tuple[GHOFL, dict[str, Any], float]:
    m = GHOFL(method_config(GHOFL, over), ctx.run)
    res = run_simulation(m, ctx.run, ctx.splits.train, ctx.federation, threads_per_client=1)
    acc = evaluate(m.predictor(res.state), ctx.splits.test, ctx.run.eval_transform).accuracy
    return m, res.state, acc


@pytest.fixture(scope="module")
def splits(tiny: Any) -> list[SeedContext]:
    return [seed_ctx(tiny, 1, None, scheme="iid"), seed_ctx(tiny, 3, 0.5), seed_ctx(tiny, 5, 0.1)]


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
        shrinkage=1e-4,
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
    ctx = seed_ctx(tiny, 2, None, federation=fed)
    m, state, acc = run(ctx, pooling=0.3)
    assert float(state["const"][9]) == ABSENT_CLASS_BIAS
    assert float(state["whiten"][9].abs().max()) == 0.0
    assert all(bool(torch.isfinite(state[k]).all()) for k in ("mean", "whiten", "const"))
    assert acc > 0.5
    rep = m.report(state)
    assert rep["bytes_up"]["0"]["statistics"] == (10 * D + 10 * D * D) * 8  # QDA: C·D + C·D²
    assert rep["gflops_per_sample"] is None and rep["head"] == "qda"
    assert (GHOFL.regime, GHOFL.uploads) == ("frozen_encoder", "statistics")


# --- refused uploads -----------------------------------------------------------------


def client_upload(tiny: Any, head: str) -> tuple[GHOFL, Upload]:
    ctx = seed_ctx(tiny, 3, 0.5)
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
