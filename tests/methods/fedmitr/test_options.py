"""FedMITR's options beyond the paper's defaults: register-token ViTs, SMI's code
behaviours (kept count, stopped pixels, best batch), the dense ``inversion_kd``
ablation and the patch-scaled jitter. Exact invariants on tiny ViTs."""

from __future__ import annotations

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.assembly import build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from osfl.methods.fedmitr import (
    KEPT_COUNTS,
    FedMITRConfig,
    StopSchedule,
    forward_with_cls_attention,
    invert_sparse,
    pixel_mask,
    stop_lowest,
)
from osfl.methods.kd import InversionConfig
from osfl.methods.kd.pixels import invert
from support.tiny import TINY_FEDMITR_OPTIONS, tiny_vit


# --------------------------------------------------------------------------- register tokens
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_attention_and_logits_skip_register_tokens(pool: str) -> None:
    m = tiny_vit(reg_tokens=3, global_pool=pool)
    with torch.no_grad():  # registers are zero at init: give them content
        m.reg_token.normal_()
    assert m.num_prefix_tokens == 4
    x = torch.randn(2, 3, 8, 8)
    keep = torch.tensor([[0, 3, 5, 9, 12], [15, 2, 7, 1, 4]])
    logits, attn = forward_with_cls_attention(m, x, keep)
    assert attn.shape == (2, 5)  # one column per kept patch, none for the registers
    torch.testing.assert_close(attn, m.attention_maps(x, keep_idx=keep))
    torch.testing.assert_close(logits, m(x, keep_idx=keep))
    dense_logits, dense_attn = forward_with_cls_attention(m, x)
    assert dense_attn.shape == (2, 16)
    torch.testing.assert_close(dense_logits, m(x))
    # the registers take attention away from the patches
    assert bool((dense_attn.sum(1) < 1).all())


# --------------------------------------------------------------------------- kept count
def test_smi_kept_count_is_floor_of_n_times_one_minus_r() -> None:
    ours = StopSchedule(ratio=0.3, stop_at=(0.1, 0.2, 0.4, 0.6))
    smi = StopSchedule(ratio=0.3, stop_at=(0.1, 0.2, 0.4, 0.6), kept_count="smi")
    # 16 patches: ours 16 - floor(4.8) = 12 -> 9 -> 7 -> 5; SMI int(11.2) = 11 -> 7 -> 4 -> 2
    assert ours.kept_counts(16, 100) == [12, 9, 7, 5]
    assert smi.kept_counts(16, 100) == [11, 7, 4, 2]
    # 196 patches (DeiT at 224): both agree while r*N is an integer, otherwise SMI keeps one fewer
    assert ours.kept_counts(196, 100) == [138, 97, 68, 48]
    assert smi.kept_counts(196, 100) == [137, 95, 66, 46]
    assert KEPT_COUNTS.get("smi")(10, 0.5) == KEPT_COUNTS.get("remaining")(10, 0.5) == 5
    keep = torch.tensor([[2, 5, 7, 11, 13]])
    attn = torch.tensor([[0.1, 0.4, 0.2, 0.3, 0.05]])
    # 5 - floor(1.5) = 4 kept vs SMI's int(3.5) = 3
    assert stop_lowest(keep, attn, 0.3, "remaining").tolist() == [[2, 5, 7, 11]]
    assert stop_lowest(keep, attn, 0.3, "smi").tolist() == [[5, 7, 11]]
    with pytest.raises(ConfigError, match="kept_count"):
        StopSchedule(kept_count="half")


# --------------------------------------------------------------------------- stopped pixels
def _invert(m, iterations: int, **kwargs: object):
    cfg = InversionConfig(
        iterations=iterations,
        lr=0.1,
        jitter=0,
        flip=False,
        keep=str(kwargs.pop("keep", "last")),
        js_weight=0.0,
        tv_l2_weight=1.0,  # a strong prior, so that it visibly moves stopped pixels
    )
    sched = StopSchedule(ratio=0.5, stop_at=(0.1,))  # one stop at iteration 1
    return invert_sparse(
        m,
        torch.tensor([0, 1, 2]),
        (3, 8, 8),
        cfg,
        sched,
        generator=torch.Generator().manual_seed(0),
        **kwargs,  # type: ignore[arg-type]
    )


def test_stopped_pixels_frozen_or_moved_by_the_priors() -> None:
    m = tiny_vit()
    one = _invert(m, 1)
    frozen = _invert(m, 10)
    priors = _invert(m, 10, stopped_pixels="priors")
    # same stop decision (iteration 1 reads iteration 0's attention, identical in both)
    assert torch.equal(frozen.keep_mask, priors.keep_mask)
    stopped = ~pixel_mask(frozen.keep_mask, (4, 4, 2, 2)).bool().expand(-1, 3, -1, -1)
    torch.testing.assert_close(frozen.images[stopped], one.images[stopped], rtol=0, atol=0)
    moved = (priors.images[stopped] - one.images[stopped]).abs()
    assert float(moved.mean()) > 1e-3  # TV and Adam's momentum still move them (SMI's code)


def test_best_batch_gets_smis_recomputed_mask() -> None:
    m = tiny_vit()
    best = _invert(m, 10, keep="best")
    last = _invert(m, 10)
    assert best.kept_history == last.kept_history == [16, 8]
    assert best.keep_mask.sum(1).tolist() == [8, 8, 8]  # the scheduled final count
    with torch.no_grad():
        _, attn = forward_with_cls_attention(m, best.images)
    expect = attn.topk(8, dim=1).indices
    for row, top in zip(best.keep_mask, expect, strict=True):
        assert sorted(row.nonzero().flatten().tolist()) == sorted(top.tolist())
    # the returned batch is the lowest-loss iterate, not the last one
    assert best.result.losses["ce"] + best.result.losses["tv_l2"] <= (
        last.result.losses["ce"] + last.result.losses["tv_l2"] + 1e-6
    )


# --------------------------------------------------------------------------- dense inversion_kd
def test_inversion_kd_is_dense_inversion_exactly() -> None:
    cfg = FedMITRConfig(variant="inversion_kd")
    assert not cfg.schedule_().sparse and FedMITRConfig().schedule_().sparse
    m = tiny_vit()
    labels = torch.tensor([0, 1, 2, 3])
    inv = InversionConfig(iterations=6, lr=0.1, jitter=1, keep="best")
    res = invert_sparse(
        m, labels, (3, 8, 8), inv, cfg.schedule_(), generator=torch.Generator().manual_seed(4)
    )
    plain = invert(
        lambda x, state: m(x), labels, (3, 8, 8), inv, generator=torch.Generator().manual_seed(4)
    )
    assert bool(res.keep_mask.all()) and res.kept_history == [16]
    torch.testing.assert_close(res.images, plain.images, rtol=0, atol=0)


def test_inversion_kd_run_pools_whole_images() -> None:
    cfg = load_config(None, TINY_FEDMITR_OPTIONS)
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    run = build_run(cfg, splits, fed, 0)
    cls = METHODS.get("fedmitr")
    opts = {
        "variant": "inversion_kd",
        "epochs": 1,
        "synthesis_batch_size": 4,
        "inversion": {"iterations": 5, "lr": 0.1, "keep": "best"},
        "distill": {"batch_size": 4, "steps": 2},
    }
    method = cls(method_config(cls, opts), run)
    res = run_simulation(method, run, splits.train, fed, threads_per_client=1)
    pool = method.artifacts(res.state)
    assert len(pool["pool_images"]) == 2 * 4 and bool(pool["pool_keep"].all())


# --------------------------------------------------------------------------- jitter
def test_jitter_scales_with_the_patch_size() -> None:
    cfg = FedMITRConfig(jitter_per_patch=0.125)
    assert [cfg.inversion_for(p).jitter for p in (4, 8, 14, 16, 32)] == [0, 1, 1, 2, 4]
    # the default scales; null keeps inversion.jitter's pixels
    assert FedMITRConfig().inversion_for(4).jitter == 0
    assert FedMITRConfig().inversion_for(16).jitter == 2
    null = FedMITRConfig(jitter_per_patch=None)
    assert null.inversion_for(4).jitter == null.inversion.jitter == 2
    assert FedMITRConfig(jitter_per_patch=1.0).inversion_for(4).jitter == 4
    with pytest.raises(ConfigError, match="jitter_per_patch"):
        FedMITRConfig(jitter_per_patch=-1.0)


# --------------------------------------------------------------------------- L_CLS filter
def test_cls_filter_keeps_only_images_the_ensemble_agrees_with() -> None:
    import torch.nn.functional as F

    from osfl.methods.fedmitr import (
        RelabelWeights,
        TokenRelabelLoss,
        idx_from_keep_mask,
        keep_mask_from_idx,
        patch_grid,
    )
    from osfl.methods.kd import DistillConfig, Distiller, EnsembleTeacher, PoolBatch

    student, members = tiny_vit(1).train(), [tiny_vit(2), tiny_vit(3)]
    teacher = EnsembleTeacher(members)
    dist = Distiller(student, teacher, DistillConfig(batch_size=6))
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        votes = teacher(x).argmax(1)
    y = votes.clone()
    y[:2] = (votes[:2] + 1) % 5  # the first two pseudo-labels disagree with the ensemble
    keep = keep_mask_from_idx(torch.arange(6).repeat(6, 1), 16)
    batch = PoolBatch(x, y, {"keep": keep})
    w = RelabelWeights(kd=0.0, cls=1.0, kl=0.0, pl=0.0)
    grid = patch_grid(student)
    loss = TokenRelabelLoss(w, grid, cls_filter="teacher")(dist, batch, x)
    hi = idx_from_keep_mask(keep)
    expect = F.cross_entropy(student(x[2:], keep_idx=hi[2:]), y[2:])
    torch.testing.assert_close(loss, expect)
    plain = TokenRelabelLoss(w, grid)(dist, batch, x)
    torch.testing.assert_close(plain, F.cross_entropy(student(x, keep_idx=hi), y))
    with pytest.raises(ConfigError, match="cls_filter"):
        TokenRelabelLoss(w, grid, cls_filter="oracle")
    with pytest.raises(ConfigError, match="cls_filter"):
        FedMITRConfig(cls_filter="oracle")
