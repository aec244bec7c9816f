"""FedCGS: the closed-form head does not depend on how the data are split
(exactly, up to float64 rounding) and equals the centralised solution; the
ridge; bad uploads; a single-class client."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from osfl.assembly import SeedContext
from osfl.config import method_config
from osfl.data.federation import Federation
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientContext
from osfl.fl.evaluate import evaluate
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.upload import Upload, validate
from osfl.methods.fedcgs import FedCGS, client_statistics, lda_head
from osfl.methods.frozen import encode_images
from support.tiny import split_ctx


def run(ctx: SeedContext, **over: Any) -> tuple[Any, float]:
    m = FedCGS(method_config(FedCGS, over), ctx.run)
    res = run_simulation(m, ctx.run, ctx.splits.train, ctx.federation, threads_per_client=1)
    acc = evaluate(m.predictor(res.state), ctx.splits.test, ctx.run.eval_transform).accuracy
    return res.state, acc


def test_partition_invariance_and_the_centralised_solution(tiny) -> None:
    splits = [
        split_ctx(tiny, 1, None, scheme="iid"),
        split_ctx(tiny, 3, 0.5),
        split_ctx(tiny, 5, 0.1),
        split_ctx(tiny, 4, 0.3),
    ]
    results = [run(ctx) for ctx in splits]
    w0, b0 = results[0][0]["weight"], results[0][0]["bias"]
    accs = {acc for _, acc in results}
    assert len(accs) == 1, f"accuracy depends on the partition: {accs}"
    for state, _ in results[1:]:
        assert torch.allclose(state["weight"], w0, rtol=1e-9, atol=1e-9 * float(w0.abs().max()))
        assert torch.allclose(state["bias"], b0, rtol=1e-9, atol=1e-9 * float(b0.abs().max()))
    assert accs.pop() > 0.5  # random tiny-ViT features still carry the digits

    # centralised: the same Gaussian classifier from all features at once (numpy)
    ctx = splits[0]
    m = FedCGS(method_config(FedCGS), ctx.run)
    f = encode_images(
        m.encoder(),
        ctx.splits.train.images,
        ctx.run.eval_transform,
        m.view_sets(),
        batch_size=64,
        device=torch.device("cpu"),
    )[:, 0]
    x, y = f.double().numpy(), ctx.splits.train.labels.numpy()
    sigma = np.cov(x, rowvar=False)
    sigma += 1e-4 * np.trace(sigma) / x.shape[1] * np.eye(x.shape[1])
    mu = np.stack([x[y == c].mean(0) for c in range(10)])
    w = np.linalg.solve(sigma, mu.T).T
    b = -0.5 * (mu * w).sum(1) + np.log(np.bincount(y) / len(y))
    assert np.allclose(w0.numpy(), w, rtol=1e-7, atol=1e-7 * np.abs(w).max())
    assert np.allclose(b0.numpy(), b, rtol=1e-7, atol=1e-7 * np.abs(b).max())


def test_within_class_covariance_option_and_the_ridge() -> None:
    torch.manual_seed(0)
    f = torch.randn(30, 4, dtype=torch.float64)
    y = torch.arange(30) % 3
    st = client_statistics(f, y, 3)
    w, b = lda_head(
        st["class_sums"],
        st["class_counts"],
        st["second_moment"],
        shrinkage=0.0,
        covariance="within",
    )
    mu = torch.stack([f[y == c].mean(0) for c in range(3)])
    sw = sum((f[y == c] - mu[c]).T @ (f[y == c] - mu[c]) for c in range(3)) / (30 - 3)
    assert torch.allclose(w, torch.linalg.solve(sw, mu.T).T)
    # D > N: the covariance is singular without a ridge, fine with one
    few = client_statistics(torch.randn(3, 8, dtype=torch.float64), torch.tensor([0, 1, 1]), 2)
    with pytest.raises(ConfigError, match="singular"):
        lda_head(few["class_sums"], few["class_counts"], few["second_moment"], shrinkage=0.0)
    w, b = lda_head(few["class_sums"], few["class_counts"], few["second_moment"], shrinkage=0.1)
    assert bool(torch.isfinite(w).all() and torch.isfinite(b).all())
    with pytest.raises(ConfigError, match="covariance"):
        method_config(FedCGS, {"covariance": "diag"})


def test_bad_uploads_are_refused_naming_client_and_field(tiny) -> None:
    ctx = split_ctx(tiny, 3, 0.5)
    m = FedCGS(method_config(FedCGS), ctx.run)
    data = ctx.splits.train.subset(ctx.federation.client_indices[1].copy())
    good = m.client_update(
        ClientContext(ctx.run, 1, 0, torch.Generator()), m.broadcast(m.init_state(), 0), data
    )
    spec = m.upload_spec({}, 0, 1)
    validate(Upload.from_bytes(good.to_bytes()), spec, client=1)
    assert good.tensors["second_moment"].dtype == torch.float64
    cases = {
        "class_sums": good.tensors["class_sums"].float(),
        "second_moment": torch.zeros(16, 15, dtype=torch.float64),
    }
    nan = good.tensors["class_sums"].clone()
    nan[0, 0] = float("nan")
    cases["class_sums "] = nan
    for key, bad in cases.items():
        name = key.strip()
        with pytest.raises(UploadError, match=rf"client 1.*{name}"):
            validate(Upload(tensors={**good.tensors, name: bad}, meta=good.meta), spec, client=1)
    wrong = dict(good.meta, class_counts=good.meta["class_counts"][:-1])
    with pytest.raises(UploadError, match=r"meta\.class_counts"):
        validate(Upload(tensors=good.tensors, meta=wrong), spec, client=1)


def test_single_class_client_and_absent_classes(tiny) -> None:
    _, splits = tiny
    labels = splits.train.labels.numpy()
    only_4 = np.flatnonzero(labels == 4)
    others = np.flatnonzero((labels != 4) & (labels != 9))  # nobody holds class 9
    fed = Federation.from_indices(
        labels,
        [only_4, others],
        scheme="manual",
        params={},
        seed=0,
        num_classes=10,
        data_fingerprint=splits.train.fingerprint(),
    )
    ctx = split_ctx(tiny, 2, None, federation=fed)
    state, acc = run(ctx)
    assert float(state["bias"][9]) < -1e29 and float(state["weight"][9].abs().max()) == 0.0
    assert acc > 0.5
    rep = FedCGS(method_config(FedCGS), ctx.run).report(state)
    assert rep["bytes_up"]["0"]["statistics"] == (10 * 16 + 16 * 16) * 8
    assert rep["gflops_per_sample"] is None


def test_statistics_no_features_can_produce_are_screened_out(tiny) -> None:
    """Valid shapes, impossible values: refused before the server's solve."""
    ctx = split_ctx(tiny, 3, 0.5)
    m = FedCGS(method_config(FedCGS), ctx.run)
    data = ctx.splits.train.subset(ctx.federation.client_indices[1].copy())
    good = m.client_update(
        ClientContext(ctx.run, 1, 0, torch.Generator()), m.broadcast(m.init_state(), 0), data
    )
    assert m.screen({}, 0, 1, good) is None
    sums, second = good.tensors["class_sums"], good.tensors["second_moment"]
    absent = good.meta["class_counts"].index(0) if 0 in good.meta["class_counts"] else None
    asym = second.clone()
    asym[0, 1] += 1.0
    cases = {
        "smaller than the class sums allow": {"second_moment": second * 1e-3},
        "not symmetric": {"second_moment": asym},
        "beyond": {"class_sums": sums * 1e200},
    }
    if absent is not None:
        ghost = sums.clone()
        ghost[absent] = 1.0
        cases["no samples"] = {"class_sums": ghost}
    for words, change in cases.items():
        why = m.screen({}, 0, 1, Upload({**good.tensors, **change}, good.meta))
        assert why is not None and words in why, (words, why)
    # a lone client whose features are all equal: a degenerate but finite head
    zero = Upload({k: torch.zeros_like(v) for k, v in good.tensors.items()}, good.meta)
    assert m.screen({}, 0, 1, zero) is None
    state = m.aggregate(m.init_state(), {1: zero}, 0)
    assert torch.isfinite(state["weight"]).all() and torch.isfinite(state["bias"]).all()


def test_upload_spec_state_release_and_report_exactly(tiny) -> None:
    """What a client must send (float64 statistics of the run's shape, one
    non-negative count per class summing to ``num_samples``), what the server
    keeps per client, what it releases and reports; with ``covariance:
    within`` the state's head is the within-class one."""
    ctx = split_ctx(tiny, 3, 0.5)
    state, _ = run(ctx, covariance="within", shrinkage=0.2)
    m = FedCGS(method_config(FedCGS, {"covariance": "within", "shrinkage": 0.2}), ctx.run)
    spec = m.upload_spec(state, 0, 0)
    c, d = ctx.run.num_classes, m.token_dim()
    assert (spec.tensors["class_sums"].shape, spec.tensors["class_sums"].dtype) == (
        (c, d),
        torch.float64,
    )
    assert (spec.tensors["second_moment"].shape, spec.tensors["second_moment"].dtype) == (
        (d, d),
        torch.float64,
    )
    counts = spec.meta["class_counts"]
    assert (counts.kind, counts.low, counts.length, counts.sum_of) == (
        "int_list",
        0,
        c,
        "num_samples",
    )
    sizes = {k: len(ix) for k, ix in enumerate(ctx.federation.client_indices)}
    assert {k: v["num_samples"] for k, v in state["clients"].items()} == sizes
    assert set(m.release(state)) == {"weight", "bias"}
    report = m.report(state)
    assert report == {
        "encoder": state["encoder"],
        "bytes_up": {str(k): v["bytes"] for k, v in state["clients"].items()},
        "gflops_per_sample": None,
        "ridge": 0.2,
        "covariance": "within",
    }
    assert m.report({"encoder": state["encoder"]})["bytes_up"] == {}
    # the head is the within-class one of the pooled statistics
    train = ctx.splits.train
    feats = encode_images(m.encoder(), train.images, ctx.run.eval_transform, m.view_sets(),
                          batch_size=64, device=torch.device("cpu"))[:, 0].double()  # fmt: skip
    st = client_statistics(feats, train.labels, c)
    w, _ = lda_head(st["class_sums"], st["class_counts"], st["second_moment"],
                    shrinkage=0.2, covariance="within")  # fmt: skip
    torch.testing.assert_close(state["weight"], w, rtol=1e-8, atol=1e-10)
