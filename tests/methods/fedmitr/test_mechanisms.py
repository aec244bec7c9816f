"""Mechanism tests of FedMITR (Shen et al., "Provable Sparse Inversion and
Token Relabel Enhanced One-shot Federated Learning with ViTs"): sparse model
inversion stops the least-attended patches on schedule, and token relabel
trains the server on the stopped patches with the ensemble's labels.
Tiny ViTs (8 px, 2-px patches: 16 patches), no trained clients needed."""

from __future__ import annotations

from typing import Any

import torch

from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.fl.upload import Upload
from osfl.methods.fedmitr import (
    RelabelWeights,
    StopSchedule,
    TokenRelabelLoss,
    idx_from_keep_mask,
    invert_sparse,
    keep_mask_from_idx,
    patch_grid,
)
from osfl.methods.fedmitr import method as method_module
from osfl.methods.fedmitr import sparse_inversion as sparse_module
from osfl.methods.kd import DistillConfig, Distiller, EnsembleTeacher, InversionConfig, PoolBatch
from osfl.methods.kd.priors import kd_kl
from support.smoke import smoke_config, smoke_context
from support.tiny import tiny_vit


def test_sparse_inversion_stops_the_least_attended_patches_on_schedule(monkeypatch) -> None:
    """Sparse model inversion (FedMITR Sec. IV-A, Alg. 1 l. 6-11; SMI): at each
    scheduled iteration the kept patches are ranked by the class token's
    last-block attention of the previous iteration and the lowest ratio r of
    them stop; in between, the kept set does not change, and the kept count
    follows the schedule (16 -> 12 -> 9 -> 7 at r = 0.3)."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = sparse_module.forward_with_cls_attention

    def spy(model, x, keep_idx=None):
        logits, attn = real(model, x, keep_idx)
        calls.append((keep_idx.clone(), attn.detach().clone()))
        return logits, attn

    monkeypatch.setattr(sparse_module, "forward_with_cls_attention", spy)
    schedule = StopSchedule(ratio=0.3, stop_at=(0.2, 0.5, 0.7))
    cfg = InversionConfig(iterations=10, lr=0.1, jitter=0, flip=False, keep="last")
    res = invert_sparse(
        tiny_vit(0),
        torch.tensor([0, 1, 2, 3]),
        (3, 8, 8),
        cfg,
        schedule,
        generator=torch.Generator().manual_seed(0),
    )
    stops = schedule.iterations(10)
    assert stops == (2, 5, 7) and len(calls) == 10
    assert res.kept_history == [16, 12, 9, 7] == [16, *schedule.kept_counts(16, 10)]
    for it in range(1, 10):
        (prev, attn), (keep, _) = calls[it - 1], calls[it]
        if it in stops:
            k = schedule.kept(prev.shape[1])
            top = attn.topk(k, dim=1).indices
            assert torch.equal(keep, prev.gather(1, top).sort(dim=1).values), it
            stopped = attn.gather(
                1, (~keep_mask_from_idx(top, prev.shape[1])).nonzero()[:, 1].view(len(prev), -1)
            )
            assert bool((stopped.max(1).values <= attn.gather(1, top).min(1).values).all())
        else:
            assert torch.equal(keep, prev), it
    assert torch.equal(res.keep_mask, keep_mask_from_idx(calls[-1][0], 16))


def test_token_relabel_trains_the_stopped_tokens_towards_the_ensemble() -> None:
    """Token relabel's L_KL (FedMITR Eq. 8): the low-information (stopped)
    tokens x_l are labelled by the client ensemble *on those tokens*, and
    distilling with that term alone brings the server's prediction on x_l to
    that label: nearer it than the server's prediction on the whole image or
    on the kept tokens, and nearer it than to the ensemble's whole-image label."""
    student = tiny_vit(1).train()
    members = [tiny_vit(2), tiny_vit(3)]
    for m in members:  # peaked, token-dependent teacher outputs
        with torch.no_grad():
            m.head.weight.mul_(40)
    teacher = EnsembleTeacher(members)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 8, 8, generator=g)
    keep = torch.stack([torch.randperm(16, generator=g)[:6].sort().values for _ in range(8)])
    batch = PoolBatch(x, torch.arange(8) % 5, {"keep": keep_mask_from_idx(keep, 16)})
    lo = idx_from_keep_mask(batch.extras["keep"], keep=False)
    loss = TokenRelabelLoss(RelabelWeights(kd=0.0, cls=0.0, kl=1.0), patch_grid(student))
    dist = Distiller(
        student, teacher, DistillConfig(optimizer="adam", lr=0.01, batch_size=8), loss_fn=loss
    )
    with torch.no_grad():
        t_lo = teacher.combine(torch.stack([m(x, keep_idx=lo) for m in members]))
        t_full = teacher(x)

    def gaps() -> dict[str, float]:
        student.eval()
        with torch.no_grad():
            s_lo, s_full, s_hi = student(x, keep_idx=lo), student(x), student(x, keep_idx=keep)
        student.train()
        return {
            "lo": float(kd_kl(s_lo, t_lo)),
            "lo_vs_whole_label": float(kd_kl(s_lo, t_full)),
            "whole": float(kd_kl(s_full, t_lo)),
            "kept": float(kd_kl(s_hi, t_lo)),
        }

    before = gaps()
    for _ in range(30):
        dist.step(batch)
    after = gaps()
    assert set(loss.last) == {"kl"}
    assert after["lo"] < 0.1 * before["lo"]
    assert after["lo"] < min(after["lo_vs_whole_label"], after["whole"], after["kept"])


def test_fedmitr_pools_its_sparse_masks_and_competes_with_the_server_model(monkeypatch) -> None:
    """FedMITR's server (Alg. 1): every synthetic batch joins the pool with the
    kept-patch mask of its sparse inversion (what token relabel splits into x_h
    and x_l), one batch per client per epoch, and the JS competitor of the
    inversion (Eq. 5) is the server model being trained."""
    calls: list[dict[str, Any]] = []
    real = method_module.invert_sparse

    def spy(client, labels, image_shape, cfg, schedule, **kw):
        calls.append(kw)
        return real(client, labels, image_shape, cfg, schedule, **kw)

    monkeypatch.setattr(method_module, "invert_sparse", spy)
    cfg = smoke_config("fedmitr")
    run = smoke_context(cfg).run
    cls = METHODS.get("fedmitr")
    options = {
        "epochs": 2,
        "synthesis_batch_size": 4,
        "inversion": {"iterations": 10, "lr": 0.1},
        "distill": {"batch_size": 4, "steps": 2},
    }
    method = cls(method_config(cls, options), run)
    state = method.init_state()
    gen = torch.Generator().manual_seed(0)
    uploads = {
        c: Upload(
            tensors={
                k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                for k, v in state["init"].items()
            },
            meta={"num_samples": 10},
        )
        for c in range(2)
    }
    state = method.aggregate(state, uploads, 0)
    pool = method.artifacts(state)
    n = 16  # 8 px / 2-px patches
    final = method.config.schedule_().kept_counts(n, 10)[-1]
    assert len(calls) == 2 * 2 and len(pool["pool_images"]) == 2 * 2 * 4
    assert pool["pool_keep"].sum(1).tolist() == [final] * 16 and final < n
    server = method.predictor(state).eval()
    x = torch.randn(3, *run.image_shape)
    with torch.no_grad():
        torch.testing.assert_close(calls[-1]["student"].eval()(x), server(x))
