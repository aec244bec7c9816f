"""FedPFT: per-class diagonal GMMs (classes smaller than K, one-sample
classes, the official drop rule), server sampling, bad uploads, a
single-class client, and the report."""

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
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.upload import Upload, validate
from osfl.methods.fedpft import FedPFT, fit_class_gmm, pooled_variance, sample_gmm_rows
from support.tiny import FAST_FEDPFT, seed_ctx


def upload_of(m: FedPFT, ctx: SeedContext, client: int) -> tuple[Upload, Any]:
    data = ctx.splits.train.subset(ctx.federation.client_indices[client].copy())
    cctx = ClientContext(ctx.run, client, 0, torch.Generator())
    return m.client_update(cctx, m.broadcast(m.init_state(), 0), data), data


def test_defaults_follow_falcon_and_the_flower_baseline() -> None:
    cfg = method_config(FedPFT)
    assert (cfg.components, cfg.small_classes, cfg.tol, cfg.max_iter) == (20, "fewer", 1e-12, 1000)
    s = cfg.server_fit
    assert (s.optimizer, s.lr, s.batch_size, s.epochs) == ("adamw", 1e-4, 32, 50)
    with pytest.raises(ConfigError, match="small_classes"):
        method_config(FedPFT, {"small_classes": "ignore"})


def test_fewer_components_for_small_classes_and_one_for_a_single_sample() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3))
    rows = fit_class_gmm(
        x, 20, seed=0, reg_covar=1e-6, tol=1e-3, max_iter=50, single_variance=np.ones(3)
    )
    assert rows.shape == (5, 7)  # min(K, n) = 5 components
    assert np.isclose(rows[:, 0].sum(), 1.0) and (rows[:, 4:] > 0).all()
    big = fit_class_gmm(
        rng.normal(size=(60, 3)),
        4,
        seed=0,
        reg_covar=1e-6,
        tol=1e-3,
        max_iter=50,
        single_variance=np.ones(3),
    )
    assert big.shape == (4, 7)
    var = np.array([0.1, 0.2, 0.3])
    one = fit_class_gmm(
        x[:1], 20, seed=0, reg_covar=1e-6, tol=1e-3, max_iter=50, single_variance=var
    )
    assert one.shape == (1, 7)
    assert np.allclose(one[0], np.concatenate([[1.0], x[0], var]))


def test_pooled_variance_uses_classes_with_two_or_more_samples() -> None:
    f = np.array([[0.0, 0.0], [2.0, 4.0], [10.0, 10.0]])
    lab = np.array([0, 0, 1])
    assert np.allclose(pooled_variance(f, lab, 1e-6), [2.0, 8.0])
    assert np.allclose(pooled_variance(f[2:], lab[2:], 1e-3), [1e-3, 1e-3])


def test_client_upload_classes_small_and_dropped(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    up, data = upload_of(m, ctx, 0)
    counts = np.bincount(data.labels.numpy(), minlength=10)
    assert up.meta["class_counts"] == counts.tolist()
    for c in range(10):
        key = f"gmm.{c}"
        if counts[c] == 0:
            assert key not in up.tensors  # an empty class uploads nothing
        else:
            t = up.tensors[key]
            assert t.dtype == torch.float16 and t.shape == (min(4, counts[c]), 33)
    validate(Upload.from_bytes(up.to_bytes()), m.upload_spec({}, 0, 0), client=0)
    drop = FedPFT(method_config(FedPFT, {**FAST_FEDPFT, "small_classes": "drop"}), ctx.run)
    up2, _ = upload_of(drop, ctx, 0)
    assert {int(k.split(".")[1]) for k in up2.tensors} == set(np.flatnonzero(counts > 4).tolist())


def test_the_float16_upload_is_rounded_once(tiny, monkeypatch) -> None:
    """The rows are rounded float64 -> float16 once, to nearest (numpy, as
    Flower's client does): torch's cast goes through float32, and a value just
    below a float16 tie, 0.51635740... (the tie is 1057.5 float16 steps of
    2^-11), rounds to the tie in float32 and then up. Which values land there
    depends on the CPU kernel path that computed the features, so a double
    rounding made the upload machine-dependent."""
    below_tie = 1057.5 * 2.0**-11 - 2e-11
    assert torch.tensor(below_tie, dtype=torch.float64).half().item() == 1058 * 2.0**-11
    monkeypatch.setattr(
        "osfl.methods.fedpft.fit_class_gmm",
        lambda features, k, **_: np.full((1, 1 + 2 * features.shape[1]), below_tie),
    )
    ctx = seed_ctx(tiny)
    up, _ = upload_of(FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run), ctx, 0)
    for rows in up.tensors.values():
        assert bool((rows.double() == 1057 * 2.0**-11).all())


def test_server_sampling_matches_the_mixture() -> None:
    rows = torch.tensor([[0.25, -5.0, 0.0, 0.01, 0.01], [0.75, 5.0, 1.0, 0.04, 0.04]])
    x = sample_gmm_rows(rows, 4000, torch.Generator().manual_seed(0), 1e-6)
    assert x.shape == (4000, 2)
    assert abs(float((x[:, 0] > 0).float().mean()) - 0.75) < 0.03
    assert abs(float(x[x[:, 0] > 0, 1].std()) - 0.2) < 0.02
    zero_w = rows.clone()
    zero_w[:, 0] = 0.0  # any valid upload can be read: falls back to uniform
    y = sample_gmm_rows(zero_w, 4000, torch.Generator().manual_seed(0), 1e-6)
    assert abs(float((y[:, 0] > 0).float().mean()) - 0.5) < 0.03


def test_bad_uploads_are_refused_naming_client_and_field(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    good, _ = upload_of(m, ctx, 2)
    spec = m.upload_spec({}, 0, 2)
    key = next(iter(good.tensors))
    for bad in (good.tensors[key].float(), torch.zeros(2, 10, dtype=torch.float16)):
        with pytest.raises(UploadError, match=rf"client 2.*{key}"):
            validate(Upload(tensors={**good.tensors, key: bad}, meta=good.meta), spec, client=2)
    inf = good.tensors[key].clone()
    inf[0, 1] = float("inf")
    with pytest.raises(UploadError, match="NaN or Inf"):
        validate(Upload(tensors={**good.tensors, key: inf}, meta=good.meta), spec, client=2)
    lying = dict(good.meta, class_counts=[c + 1 for c in good.meta["class_counts"]])
    with pytest.raises(UploadError, match=r"meta\.class_counts"):
        validate(Upload(tensors=good.tensors, meta=lying), spec, client=2)


def test_single_class_client_and_report(tiny) -> None:
    _, splits = tiny
    labels = splits.train.labels.numpy()
    only_7 = np.flatnonzero(labels == 7)[:1]  # one sample, one class
    rest = np.setdiff1d(np.arange(len(labels)), only_7)
    fed = Federation.from_indices(
        labels,
        [only_7, rest[::2], rest[1::2]],
        scheme="manual",
        params={},
        seed=0,
        num_classes=10,
        data_fingerprint=splits.train.fingerprint(),
    )
    ctx = seed_ctx(tiny, fed)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    res = run_simulation(m, ctx.run, splits.train, fed, threads_per_client=1)
    assert not res.refused
    rep = m.report(res.state)
    assert rep["classes_sent"]["0"] == [7]
    assert rep["bytes_up"]["0"]["gmms"] == 33 * 2  # one fp16 component row
    assert rep["encoder"]["weights"] == "random"
    assert rep["gflops_per_sample"] == 0.0  # elementwise sampling: FlopCounterMode counts none
