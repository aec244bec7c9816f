"""FedMITR's sparse inversion and token relabel: exact invariants on a tiny ViT."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import osfl.methods.fedmitr.sparse_inversion as si
from osfl.errors import ConfigError
from osfl.methods.fedmitr import (
    VARIANTS,
    RelabelWeights,
    StopSchedule,
    TokenRelabelLoss,
    ensemble_on_tokens,
    forward_with_cls_attention,
    idx_from_keep_mask,
    invert_sparse,
    keep_mask_from_idx,
    patch_grid,
    pixel_mask,
    remap_keep_idx,
    stop_lowest,
)
from osfl.methods.fedmitr.relabel import LOW_DENSITY_INPUTS
from osfl.methods.kd import DistillConfig, Distiller, EnsembleTeacher, InversionConfig, PoolBatch
from osfl.methods.kd.pixels import Jitter
from osfl.methods.kd.priors import kd_kl
from support.tiny import tiny_vit


def test_sparse_forward_with_every_patch_equals_dense() -> None:
    m = tiny_vit()
    x = torch.randn(3, 3, 8, 8)
    keep = torch.arange(16).unsqueeze(0).repeat(3, 1)
    dense = m(x)
    logits, attn = forward_with_cls_attention(m, x, keep)
    torch.testing.assert_close(m(x, keep_idx=keep), dense)
    torch.testing.assert_close(logits, dense)
    torch.testing.assert_close(attn, m.attention_maps(x))
    # the attention row (without the class token's self-attention) sums to < 1
    assert bool((attn.sum(1) < 1).all()) and bool((attn > 0).all())


def test_forward_with_attention_on_a_subset_matches_the_model() -> None:
    m = tiny_vit()
    x = torch.randn(2, 3, 8, 8)
    keep = torch.tensor([[0, 3, 5, 9], [15, 2, 7, 1]])  # any order: positions travel with tokens
    logits, attn = forward_with_cls_attention(m, x, keep)
    torch.testing.assert_close(logits, m(x, keep_idx=keep))
    torch.testing.assert_close(attn, m.attention_maps(x, keep_idx=keep))
    assert attn.shape == (2, 4)


def test_stop_schedule_keeps_the_right_number_of_patches() -> None:
    s = StopSchedule(ratio=0.3, stop_at=(0.1, 0.2, 0.4, 0.6))
    assert s.iterations(100) == (10, 20, 40, 60)
    # floor(0.3*64)=19 -> 45; floor(13.5)=13 -> 32; floor(9.6)=9 -> 23; floor(6.9)=6 -> 17
    assert s.kept_counts(64, 100) == [45, 32, 23, 17]
    assert StopSchedule(ratio=0.5, stop_at=(0.5,)).kept_counts(16, 10) == [8]
    assert StopSchedule(ratio=0.9, stop_at=(0.2, 0.4, 0.6)).kept_counts(4, 10) == [1, 1, 1]
    assert StopSchedule(ratio=0.0).iterations(100) == ()
    for bad in (dict(ratio=1.0), dict(ratio=-0.1), dict(stop_at=(0.5, 0.2)), dict(stop_at=(1.0,))):
        with pytest.raises(ConfigError):
            StopSchedule(**bad)  # type: ignore[arg-type]


def test_stop_lowest_keeps_highest_attention() -> None:
    keep = torch.tensor([[2, 5, 7, 11], [0, 1, 2, 3]])
    attn = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.5, 0.1, 0.3, 0.05]])
    # 4 - floor(0.5*4) = 2 kept: the two largest attentions, sorted
    assert stop_lowest(keep, attn, 0.5).tolist() == [[5, 11], [0, 2]]


def test_remap_follows_rolled_and_flipped_patches() -> None:
    m = tiny_vit()
    grid = patch_grid(m)
    assert grid == (4, 4, 2, 2)
    # an image whose every pixel holds its patch index
    ids = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4)
    img = ids.repeat_interleave(2, 2).repeat_interleave(2, 3)
    keep = torch.tensor([[0, 5, 6, 15]])
    for jit in (Jitter(2, -4, False), Jitter(-2, 2, True), Jitter(0, 0, True), Jitter(6, 2, False)):
        moved = jit.apply(img)
        new = remap_keep_idx(keep, jit, grid)
        r, c = new // 4, new % 4
        seen = moved[0, 0, r[0] * 2, c[0] * 2]  # top-left pixel of each remapped patch
        assert seen.tolist() == keep[0].float().tolist(), jit
    # a half-patch shift rounds away from zero, symmetrically
    assert remap_keep_idx(torch.tensor([[5]]), Jitter(1, -1, False), grid).tolist() == [
        [8]
    ]  # (1, 1) -> (2, 0)


def test_masks_round_trip() -> None:
    keep = torch.tensor([[0, 3], [1, 15]])
    mask = keep_mask_from_idx(keep, 16)
    assert mask.sum(1).tolist() == [2, 2]
    assert idx_from_keep_mask(mask).tolist() == [[0, 3], [1, 15]]
    assert idx_from_keep_mask(mask, keep=False).shape == (2, 14)
    pm = pixel_mask(mask, (4, 4, 2, 2))
    assert pm.shape == (2, 1, 8, 8) and float(pm.sum()) == 2 * 2 * 4
    assert float(pm[0, 0, 0:2, 6:8].sum()) == 4  # patch 3 = row 0, column 3
    with pytest.raises(ConfigError):
        idx_from_keep_mask(torch.tensor([[True, False], [True, True]]))


def test_stopped_patches_are_frozen_and_leave_the_forward() -> None:
    m = tiny_vit()
    labels = torch.tensor([0, 1, 2])
    base = dict(lr=0.1, jitter=0, flip=False, keep="last", js_weight=0.0)
    sched = StopSchedule(ratio=0.5, stop_at=(0.1,))  # one stop at iteration 1 of 2..10

    def run(iterations: int):
        cfg = InversionConfig(iterations=iterations, **base)  # type: ignore[arg-type]
        return invert_sparse(
            m, labels, (3, 8, 8), cfg, sched, generator=torch.Generator().manual_seed(0)
        )

    one, two = run(1), run(10)
    assert one.kept_history == [16] and bool(one.keep_mask.all())
    assert two.kept_history == [16, 8]
    assert two.keep_mask.sum(1).tolist() == [8, 8, 8]
    stopped = ~pixel_mask(two.keep_mask, (4, 4, 2, 2)).bool().expand(-1, 3, -1, -1)
    # stopped pixels keep exactly the value they had when they stopped (after iteration 0)
    torch.testing.assert_close(two.images[stopped], one.images[stopped], rtol=0, atol=0)
    assert not torch.equal(two.images[~stopped], one.images[~stopped])
    with pytest.raises(ConfigError, match="stopped_pixels"):
        invert_sparse(
            m, labels, (3, 8, 8), InversionConfig(iterations=2), sched, stopped_pixels="x"
        )


def _pool_batch(keep_count: int = 6) -> PoolBatch:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 8, 8, generator=g)
    keep = torch.stack(
        [torch.randperm(16, generator=g)[:keep_count].sort().values for _ in range(4)]
    )
    return PoolBatch(x, torch.tensor([0, 1, 2, 3]), {"keep": keep_mask_from_idx(keep, 16)})


def test_token_relabel_loss_matches_eq8_by_hand() -> None:
    student = tiny_vit(1).train()
    members = [tiny_vit(2), tiny_vit(3)]
    teacher = EnsembleTeacher(members)
    dist = Distiller(student, teacher, DistillConfig(batch_size=4))
    batch = _pool_batch()
    x, y = batch.images, batch.labels
    hi = idx_from_keep_mask(batch.extras["keep"])
    lo = idx_from_keep_mask(batch.extras["keep"], keep=False)
    grid = patch_grid(student)
    loss = TokenRelabelLoss(RelabelWeights(kd=1.0, cls=0.5, kl=0.5), grid)(dist, batch, x)
    with torch.no_grad():
        t_full = teacher(x)
        t_lo = teacher.combine(torch.stack([m(x, keep_idx=lo) for m in members]))
    expect = (
        kd_kl(student(x), t_full)
        + 0.5 * F.cross_entropy(student(x, keep_idx=hi), y)
        + 0.5 * kd_kl(student(x, keep_idx=lo), t_lo)
    )
    torch.testing.assert_close(loss, expect)
    torch.testing.assert_close(ensemble_on_tokens(teacher, x, lo, grid, "sparse"), t_lo)
    loss.backward()
    assert all(p.grad is not None for p in student.parameters() if p.requires_grad)
    # the masked alternative is finite and differs
    masked = TokenRelabelLoss(RelabelWeights(kd=0.0, cls=0.0, kl=1.0), grid, "masked")
    assert torch.isfinite(masked(dist, batch, x))


def test_variants_are_the_paper_ablations() -> None:
    assert VARIANTS.get("fedmitr")(0.5, 0.25) == RelabelWeights(1.0, 0.5, 0.25, 0.0)
    assert VARIANTS.get("inversion_kd")(0.5, 0.5) == RelabelWeights(1.0, 0.0, 0.0, 0.0)
    # Table III's "Inversion + KD" = Table I's DeepInversion column: dense inversion
    assert not VARIANTS.get("inversion_kd").sparse
    assert all(VARIANTS.get(v).sparse for v in ("fedmitr", "inversion_pl", "no_cls", "no_kl"))
    assert VARIANTS.get("inversion_pl")(0.5, 0.5) == RelabelWeights(0.0, 0.0, 0.0, 1.0)
    assert VARIANTS.get("no_cls")(0.5, 0.5).cls == 0.0
    assert VARIANTS.get("no_kl")(0.5, 0.5).kl == 0.0
    with pytest.raises(ConfigError):
        RelabelWeights(0.0, 0.0, 0.0, 0.0)
    # inversion + PL is plain CE to the pseudo-labels on the whole image
    student = tiny_vit(1)
    dist = Distiller(student, None, DistillConfig(batch_size=4, kd_weight=0.0))
    batch = _pool_batch()
    pl = TokenRelabelLoss(VARIANTS.get("inversion_pl")(0.5, 0.5), patch_grid(student))
    torch.testing.assert_close(
        pl(dist, batch, batch.images), F.cross_entropy(student(batch.images), batch.labels)
    )


def test_no_stopped_patch_means_no_kl_term() -> None:
    student, members = tiny_vit(1), [tiny_vit(2)]
    dist = Distiller(student, EnsembleTeacher(members), DistillConfig(batch_size=4))
    batch = _pool_batch(keep_count=16)
    loss = TokenRelabelLoss(RelabelWeights(), patch_grid(student))
    loss(dist, batch, batch.images)
    assert set(loss.last) == {"kd", "cls"}


def test_the_js_term_s_student_sees_the_client_s_kept_tokens(monkeypatch) -> None:
    """Eq. 5-6: the JS term compares the client and the server student on the
    same sparse input (SMI feeds the student the client's kept tokens); a
    student that saw the whole image would compare two different inputs."""
    seen: dict[str, list] = {"client": [], "student": []}
    real = si.forward_with_cls_attention

    def client_spy(model, x, keep_idx):
        seen["client"].append(keep_idx.clone())
        return real(model, x, keep_idx)

    class RecordingStudent(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x, keep_idx=None):
            seen["student"].append(None if keep_idx is None else keep_idx.clone())
            return self.inner(x, keep_idx=keep_idx)

    monkeypatch.setattr(si, "forward_with_cls_attention", client_spy)
    cfg = InversionConfig(iterations=6, lr=0.1, jitter=1, flip=False, keep="last", js_weight=1.0)
    invert_sparse(
        tiny_vit(0),
        torch.tensor([0, 1]),
        (3, 8, 8),
        cfg,
        StopSchedule(ratio=0.5, stop_at=(0.3,)),
        student=RecordingStudent(tiny_vit(1)),
        generator=torch.Generator().manual_seed(0),
    )
    assert len(seen["student"]) == len(seen["client"]) == 6
    assert {c.shape[1] for c in seen["client"]} == {16, 8}  # a stop happened
    for client_idx, student_idx in zip(seen["client"], seen["student"], strict=True):
        assert student_idx is not None and torch.equal(student_idx, client_idx)


def test_masked_low_density_input_shows_only_the_stopped_patches() -> None:
    """``low_density_input: masked``: the model sees x_l, the image with every
    patch but the low-density (stopped) ones zeroed (the paper's M ⊙ X)."""

    class Pixels(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)

    x = torch.arange(1, 1 + 3 * 8 * 8, dtype=torch.float32).view(1, 3, 8, 8)
    low_idx = torch.tensor([[0, 5]])  # patch 0 = rows 0-1, cols 0-1; patch 5 = rows 2-3, cols 2-3
    expected = torch.zeros_like(x)
    expected[..., 0:2, 0:2] = x[..., 0:2, 0:2]
    expected[..., 2:4, 2:4] = x[..., 2:4, 2:4]
    masked = LOW_DENSITY_INPUTS.get("masked")
    torch.testing.assert_close(masked(Pixels(), x, low_idx, (4, 4, 2, 2)), expected.flatten(1))
