"""EFTViT as a method: masking, the local module kept in client state (the
simulation and the loopback Flower runtime agree), the head broadcast, the
upload spec refusing bad uploads, the predictor's bottom, costs (Table 4/5
shapes) and the option checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.fl.upload import Upload, validate
from osfl.flower.loopback import FlowerLoopbackRuntime
from osfl.methods.eftvit import EFTViT, EFTViTNet, MaskedTraining, num_kept, pack_features
from osfl.methods.eftvit.client import head_names, local_names
from osfl.methods.peft.flops import forward_gflops
from osfl.models import create_model
from support.smoke import SMALL_VIT_SPLIT

BASE = (
    *SMALL_VIT_SPLIT,
    "train.batch_size=16",
    "cache_dir=null",
    "seeds=[0]",
)
_SPLITS: dict[str, Any] = {}


def job_of(*extra: str, smoke: bool = True) -> Any:
    own = METHODS.get("eftvit").card.smoke if smoke else ()
    cfg = load_config(None, [*BASE, "methods=[eftvit]", *own, *extra])
    key = repr(cfg.data)
    if key not in _SPLITS:
        _SPLITS[key] = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, _SPLITS[key], 0)
    job = assembly.build_job(cfg, "eftvit", ctx)
    job.method.check()
    return job


def client_ctx(
    m: EFTViT, client: int, round: int, state: ClientState | None = None
) -> ClientContext:
    return ClientContext(
        m.run, client, round, torch.Generator().manual_seed(round), state or ClientState()
    )


def test_masks_drop_r_of_the_patches_freshly_per_image_and_epoch() -> None:
    torch.manual_seed(0)
    vit = create_model(
        "vit_tiny_patch2_16", img_size=8, in_chans=1, depth=2, embed_dim=32, num_heads=2
    )
    net = EFTViTNet(vit, 1)
    assert net.num_patches == 16 and num_kept(16, 0.75) == 4 and num_kept(196, 0.75) == 49

    class Recording(MaskedTraining):
        def __call__(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            self.inputs = [*getattr(self, "inputs", []), x.detach().clone()]
            return super().__call__(model, x, y)

    from osfl.data.imageset import ImageSet

    images = torch.randint(0, 255, (12, 1, 8, 8), dtype=torch.uint8)
    data = ImageSet(images, torch.arange(12) % 3, classes=("a", "b", "c"))
    masked = Recording(4, torch.Generator().manual_seed(0))
    cfg = TrainConfig(epochs=3, batch_size=5, optimizer="adamw", lr=1e-3)
    train_local(net, data, cfg, loss_fn=masked, generator=torch.Generator().manual_seed(1))
    assert len(masked.kept) == 3 * 3
    masks: dict[bytes, list[tuple[int, ...]]] = {}
    for x, kept, tokens in zip(masked.inputs, masked.kept, masked.tokens, strict=True):
        assert kept.shape == (len(x), 4)  # 75 % of 16 patches dropped, per image
        assert all(
            len(set(row.tolist())) == 4 and row.tolist() == sorted(row.tolist()) for row in kept
        )
        assert tokens.shape == (len(x), 1 + 4, 32)
        for img, row in zip(x, kept, strict=True):
            masks.setdefault(img.numpy().tobytes(), []).append(tuple(row.tolist()))
    assert len(masks) == 12 and all(len(v) == 3 for v in masks.values())
    assert sum(len(set(v)) > 1 for v in masks.values()) >= 11  # new mask every epoch
    # kept tokens keep their own position embeddings (added before the gather)
    x = masked.inputs[0]
    keep = masked.kept[0]
    dense = vit.embed(x)
    sparse = vit.embed(x, keep)
    torch.testing.assert_close(
        sparse[:, 1:], torch.gather(dense[:, 1:], 1, keep[..., None].expand(-1, -1, 32))
    )


def test_local_module_persists_through_client_state() -> None:
    job = job_of("train.epochs=2")
    m: EFTViT = job.method
    state = m.init_state()
    b = m.broadcast(state, 0)
    data = job.clients.data(0)
    own = ClientState()
    m.client_update(client_ctx(m, 0, 0, own), b, data)
    roles = m.names()
    assert set(own.tensors) == set(roles.local)  # the local module, nothing else
    base = m.base.state()
    assert any(not torch.equal(own.tensors[n], base[n]) for n in roles.local)
    assert own.meta["sampling"][0]["round"] == 0
    net = m.client_net(b.tensors, own)  # round 1 starts from the kept local module
    params = dict(net.vit.named_parameters())
    assert all(torch.equal(params[n], own.tensors[n]) for n in roles.local)
    fresh = m.client_update(client_ctx(m, 0, 1), b, data)
    kept = m.client_update(client_ctx(m, 0, 1, own), b, data)
    assert any(not torch.equal(fresh.tensors[k], kept.tensors[k]) for k in fresh.tensors)
    assert len(own.meta["sampling"]) == 2


def test_simulation_and_flower_loopback_agree_over_rounds() -> None:
    job = job_of("train.epochs=2", "method.eftvit.rounds=2")
    sim = SimulationRuntime().execute(job)
    assert sim.refused == []
    assert sorted(sim.client_states) == [0, 1, 2]
    for st in sim.client_states.values():
        assert set(st.tensors) == set(job.method.names().local)
        assert [r["round"] for r in st.meta["sampling"]] == [0, 1]
    flower = FlowerLoopbackRuntime().execute(job_of("train.epochs=2", "method.eftvit.rounds=2"))
    assert flower.metrics == sim.metrics
    assert (flower.bytes_up, flower.bytes_down) == (sim.bytes_up, sim.bytes_down)
    for n, v in sim.state.global_module.items():
        assert torch.equal(v, flower.state.global_module[n]), n
    assert [h["per_client"] for h in sim.state.history] == [
        h["per_client"] for h in flower.state.history
    ]
    # the server's predictor: the pretrained local module under the trained global module
    model = job.method.global_model(sim.state)
    base = job.method.base.state()
    for n, p in model.named_parameters():
        ref = sim.state.global_module[n] if n in sim.state.global_module else base[n]
        assert torch.equal(p, ref), n
    # a client's own model: its local module
    b = job.method.broadcast(sim.state, 2)
    client = job.method.client_predictor(b, sim.client_states[1]).model
    assert torch.equal(
        dict(client.named_parameters())["blocks.0.attn.qkv.weight"],
        sim.client_states[1].tensors["blocks.0.attn.qkv.weight"],
    )
    # the records carry both predictors, and Flower's nodes scored the same models
    assert set(sim.metrics) >= {"global_test_accuracy", "mean_client_accuracy", "client_accuracies"}
    assert "clients_not_sampled" in sim.metrics and "server_accuracy" not in sim.metrics


def test_head_is_broadcast_or_kept_private() -> None:
    m = job_of().method
    sent = set(m.broadcast(m.init_state(), 0).tensors)
    assert {"head.weight", "head.bias", "norm.weight"} <= sent
    assert not any(
        n.startswith(("blocks.0.", "patch_embed", "pos_embed", "cls_token")) for n in sent
    )
    private = job_of("method.eftvit.broadcast_head=false")
    pm = private.method
    assert "head.weight" not in pm.broadcast(pm.init_state(), 0).tensors
    assert "head.weight" in pm.init_state().global_module  # the server trains its own head
    own = ClientState()
    pm.client_update(
        client_ctx(pm, 0, 0, own), pm.broadcast(pm.init_state(), 0), private.clients.data(0)
    )
    assert {"head.weight", "head.bias"} <= set(own.tensors)


def test_uploads_pass_their_spec_and_bad_ones_are_refused() -> None:
    job = job_of("train.epochs=2")
    m: EFTViT = job.method
    state = m.init_state()
    data = job.clients.data(2)
    up = m.client_update(client_ctx(m, 2, 0), m.broadcast(state, 0), data)
    spec = m.upload_spec(state, 0, 2)
    validate(up, spec, client=2)
    m_th = up.meta["threshold"]
    held = [c for c, n in enumerate(data.class_counts()) if n > 0]
    assert up.meta["counts"] == [m_th if c in held else 0 for c in range(10)]
    assert sorted(int(k.split(".")[1]) for k in up.tensors) == held
    t = m.tokens_per_feature()
    assert t == 1 + num_kept(4, 0.5) and all(v.shape[1:] == (t, 64) for v in up.tensors.values())

    key = next(iter(up.tensors))
    wide = Upload(tensors={**up.tensors, key: torch.zeros(m_th, t, 65)}, meta=up.meta)
    with pytest.raises(UploadError, match="shape") as e:
        validate(wide, spec, client=2)
    assert e.value.client == 2 and e.value.field == key
    counts = list(up.meta["counts"])
    counts[held[0]] -= 1
    uneven = {**up.meta, "counts": counts, "num_features": sum(counts)}
    with pytest.raises(UploadError, match="padded median sampling") as e:
        validate(Upload(tensors=up.tensors, meta=uneven), spec, client=2)
    assert e.value.field == "meta.counts"
    bad_sum = {**up.meta, "num_features": up.meta["num_features"] + 1}
    with pytest.raises(UploadError, match="sums to"):
        validate(Upload(tensors=up.tensors, meta=bad_sum), spec, client=2)
    with pytest.raises(UploadError, match="unexpected"):
        validate(Upload(tensors={**up.tensors, "features.10": up.tensors[key]}, meta=up.meta), spec)
    nan = up.tensors[key].clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(UploadError, match="NaN"):
        validate(Upload(tensors={**up.tensors, key: nan}, meta=up.meta), spec)
    # without padding: at most m per class, and some class at m
    loose = job_of("method.eftvit.pad=false").method.upload_spec(state, 0, 2)
    ok = pack_features({0: torch.zeros(3, t, 64), 1: torch.zeros(2, t, 64)}, 10, 3)
    validate(ok, loose)
    with pytest.raises(UploadError, match="more than"):
        validate(pack_features({0: torch.zeros(4, t, 64)}, 10, 3), loose)
    # a tensor's rows must be its declared count
    short = Upload(tensors={**up.tensors, key: up.tensors[key][:-1]}, meta=up.meta)
    with pytest.raises(UploadError, match="shape") as e:
        validate(short, spec, client=2)
    assert e.value.field == key
    # declared counts without their tensors pass the spec but the screen refuses them
    hollow = Upload(tensors={}, meta=up.meta)
    validate(hollow, spec)
    assert f"class {held[0]}" in (m.screen(state, 0, 2, hollow) or "")
    assert m.screen(state, 0, 2, up) is None


def test_report_costs_and_uploads() -> None:
    job = job_of("train.epochs=2", "method.eftvit.rounds=1")
    result = SimulationRuntime().execute(job)
    rep = job.method.report(result.state)
    vit = job.method.base_vit()
    n_local = sum(
        p.numel() for n, p in vit.named_parameters() if n in set(job.method.names().local)
    )
    assert rep["client"]["trainable_parameters"] == n_local + 64 * 10 + 10
    assert (
        rep["client"]["forward_gflops_per_image"]
        < rep["client"]["forward_gflops_per_image_unmasked"]
    )
    up = rep["uploads"][0]
    assert up["features"] == sum(up["per_class"]) == sum(sum(v) for v in up["per_client"].values())
    assert rep["server_training"][0]["steps"] > 0


def test_local_module_parameters_match_table_5() -> None:
    """ViT-B/16, M = 2, 10 classes: 14.23 Mi trainable parameters on a client
    (patch embedding, class and position embeddings, 2 blocks, head)."""
    with torch.device("meta"):
        vit = create_model("vit_base_patch16_224", num_classes=10)
    params = dict(vit.named_parameters())
    count = sum(params[n].numel() for n in [*local_names(vit, 2), *head_names(vit)])
    assert count == 14_926_090
    assert round(count / 2**20, 2) == 14.23


def test_masked_forward_is_4x_cheaper_like_table_4() -> None:
    """A 12-block ViT with ViT-B/16's tokens-to-width ratio (49 patches, width
    192): GFLOPs ratios to the unmasked forward near the paper's Table 4
    (12.005 / 8.914 / 5.911 / 2.997 / 0.684 GFLOPs at r = 0 / .25 / .5 / .75 / .95)."""
    torch.manual_seed(0)
    vit = create_model(
        "vit_base_patch16_224",
        img_size=28,
        patch_size=4,
        embed_dim=192,
        num_heads=3,
        num_classes=10,
    )
    net = EFTViTNet(vit, 2).eval()
    x = torch.zeros(2, 3, 28, 28)
    full = forward_gflops(net, x)
    ratios = {}
    for r in (0.25, 0.5, 0.75, 0.95):
        keep = torch.arange(num_kept(vit.num_patches, r)).expand(2, -1)
        ratios[r] = full / forward_gflops(lambda t, k=keep: net(t, k), x)
    paper = {0.25: 12.005 / 8.914, 0.5: 12.005 / 5.911, 0.75: 12.005 / 2.997, 0.95: 12.005 / 0.684}
    assert 3.6 < ratios[0.75] < 4.4  # ≈ 4× (paper: 4.006)
    token_limit = (49 + 1) / (num_kept(49, 0.75) + 1)  # 50 tokens -> 13
    assert abs(ratios[0.75] - token_limit) / token_limit < 0.1
    for r, p in paper.items():
        assert abs(ratios[r] - p) / p < 0.1, (r, ratios[r], p)
    assert ratios[0.25] < ratios[0.5] < ratios[0.75] < ratios[0.95]


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="local_depth"):
        job_of("method.eftvit.local_depth=2")  # the smoke ViT has 2 blocks
    with pytest.raises(ConfigError, match="needs a ViT"):
        job_of("model.name=cnn_small", smoke=False)
    with pytest.raises(ConfigError, match=r"train\.steps"):
        job_of("train.steps=3")
    with pytest.raises(ConfigError, match="mask_ratio"):
        job_of("method.eftvit.mask_ratio=1.0")
    with pytest.raises(ConfigError, match="keeps no patch"):
        job_of("method.eftvit.mask_ratio=0.9")  # 4 patches: none kept
