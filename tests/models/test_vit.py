"""ViT/DeiT/DINOv2: timm parameter names and the token-level extras (sparse
forward, attention maps, block split, token logits) against the dense forward,
with and without register tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.models import VisionTransformer, create_model, random_keep_idx

B, C = 3, 5
DEPTH, HEADS, DIM = 3, 3, 48
N = 16  # 16 px / patch 4 -> 4x4 grid


@pytest.fixture(params=[0, 2], ids=["cls", "cls+2reg"])
def vit(request: pytest.FixtureRequest) -> VisionTransformer:
    """Every extra must hold with register tokens too (DINOv2-reg)."""
    torch.manual_seed(0)
    model = create_model(
        "vit_tiny_patch4_32",
        num_classes=C,
        img_size=16,
        depth=DEPTH,
        num_heads=HEADS,
        embed_dim=DIM,
        reg_tokens=request.param,
    ).eval()
    if model.reg_token is not None:  # O(1) registers, so that they matter
        nn.init.normal_(model.reg_token)
    return model


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_timm_parameter_names() -> None:
    model = create_model("deit_tiny_patch16_224", depth=1)
    block = [
        "norm1.weight",
        "norm1.bias",
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "norm2.weight",
        "norm2.bias",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
    ]
    expected = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}
    expected |= {f"blocks.0.{k}" for k in block}
    expected |= {"norm.weight", "norm.bias", "head.weight", "head.bias"}
    sd = model.state_dict()
    assert set(sd) == expected
    assert sd["pos_embed"].shape == (1, 1 + 14 * 14, 192)
    assert sd["blocks.0.attn.qkv.weight"].shape == (3 * 192, 192)
    # timm's ViT-Ti/16 has 5,717,416 parameters at 1000 classes, 224 px
    full = create_model("vit_tiny_patch16_224")
    assert sum(p.numel() for p in full.parameters()) == 5_717_416
    ls = create_model("vit_tiny_patch4_32", depth=1, init_values=1e-5)
    assert "blocks.0.ls1.gamma" in ls.state_dict() and "blocks.0.ls2.gamma" in ls.state_dict()


def test_all_tokens_kept_equals_dense(vit: VisionTransformer, x: torch.Tensor) -> None:
    dense = vit(x)
    every = torch.arange(N).expand(B, N)
    close(vit(x, keep_idx=every), dense)
    close(vit(x, keep_idx=torch.arange(N)), dense)  # (K,) shared by the batch
    close(vit.forward_features(x, keep_idx=every), vit.forward_features(x))


def test_permuted_tokens_equal_dense(vit: VisionTransformer, x: torch.Tensor) -> None:
    """Position is added before the gather, so any order of all patches gives the
    same class-token output (attention is permutation-equivariant)."""
    g = torch.Generator().manual_seed(2)
    perm = torch.stack([torch.randperm(N, generator=g) for _ in range(B)])
    close(vit(x, keep_idx=perm), vit(x))


def test_sparse_rows_are_independent(vit: VisionTransformer, x: torch.Tensor) -> None:
    keep = random_keep_idx(B, N, 5, generator=torch.Generator().manual_seed(3))
    batched = vit(x, keep_idx=keep)
    assert batched.shape == (B, C) and torch.isfinite(batched).all()
    for b in range(B):
        close(batched[b : b + 1], vit(x[b : b + 1], keep_idx=keep[b : b + 1]))
    assert not torch.allclose(batched, vit(x))  # dropping tokens changes the output


def test_dropped_patches_get_no_pixel_gradient(vit: VisionTransformer) -> None:
    """Sparse inversion relies on this: pixels of a dropped patch are untouched."""
    img = torch.randn(1, 3, 16, 16, requires_grad=True)
    keep = torch.tensor([[0, 5, 15]])
    vit(img, keep_idx=keep).sum().backward()
    per_patch = img.grad.abs().reshape(3, 4, 4, 4, 4).sum(dim=(0, 2, 4)).flatten()
    assert (per_patch[[0, 5, 15]] > 0).all()
    mask = torch.ones(N, dtype=torch.bool)
    mask[[0, 5, 15]] = False
    assert (per_patch[mask] == 0).all()


def test_bad_keep_idx_refused(vit: VisionTransformer, x: torch.Tensor) -> None:
    with pytest.raises(ConfigError, match="integer"):
        vit(x, keep_idx=torch.zeros(B, 2))
    with pytest.raises(ConfigError, match=r"\(B, K\)"):
        vit(x, keep_idx=torch.zeros(B + 1, 2, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\[0, 16\)"):
        vit(x, keep_idx=torch.tensor([0, 16]))


@pytest.mark.parametrize("m", [0, 1, DEPTH])
def test_split_composes_to_full(vit: VisionTransformer, x: torch.Tensor, m: int) -> None:
    bottom, top = vit.split(m)
    close(top(bottom(x)), vit(x))
    close(top.forward_features(bottom(x)), vit.forward_features(x))
    keep = random_keep_idx(B, N, 6, generator=torch.Generator().manual_seed(4))
    close(top(bottom(x, keep_idx=keep)), vit(x, keep_idx=keep))
    # the halves share the model's parameters, disjointly, and cover all of them
    pb, pt, pm = ({id(p) for p in mod.parameters()} for mod in (bottom, top, vit))
    assert not pb & pt and pb | pt == pm
    assert set(top.state_dict()) <= set(vit.state_dict())
    assert set(bottom.state_dict()) <= set(vit.state_dict())
    assert len(bottom.blocks) == m and len(top.blocks) == DEPTH - m


def test_split_halves_train_separately(vit: VisionTransformer, x: torch.Tensor) -> None:
    bottom, top = vit.split(1)
    tokens = bottom(x).detach()  # what an EFTViT client uploads
    top(tokens).sum().backward()
    assert all(p.grad is None for p in bottom.parameters())
    assert all(p.grad is not None for p in top.parameters())
    with pytest.raises(ConfigError, match=r"\[0, 3\]"):
        vit.split(DEPTH + 1)


def test_token_logits(vit: VisionTransformer, x: torch.Tensor) -> None:
    tl = vit.token_logits(x)
    assert tl.shape == (B, 1 + N, C)
    close(tl[:, 0], vit(x))
    keep = random_keep_idx(B, N, 4)
    tk = vit.token_logits(x, keep_idx=keep)
    assert tk.shape == (B, 5, C)
    close(tk[:, 0], vit(x, keep_idx=keep))


def test_attention_maps(vit: VisionTransformer, x: torch.Tensor) -> None:
    avg = vit.attention_maps(x)
    per_head = vit.attention_maps(x, average_heads=False)
    assert avg.shape == (B, N) and per_head.shape == (B, HEADS, N)
    close(per_head.mean(dim=1), avg)
    assert (per_head >= 0).all()
    sums = per_head.sum(dim=-1)  # 1 minus the class token's attention to itself
    assert (sums > 0).all() and (sums <= 1 + 1e-6).all()
    close(vit.attention_maps(x, block=0), vit.attention_maps(x, block=-DEPTH))
    assert vit.attention_maps(x, keep_idx=random_keep_idx(B, N, 7)).shape == (B, 7)
    with pytest.raises(ConfigError, match="out of range"):
        vit.attention_maps(x, block=DEPTH)


def test_attention_weights_match_fused_path(vit: VisionTransformer) -> None:
    attn = vit.blocks[0].attn
    t = torch.randn(2, 1 + N, DIM)
    w = attn.attention_weights(t)
    close(w.sum(dim=-1), torch.ones(2, HEADS, 1 + N))
    v = attn.qkv(t).reshape(2, 1 + N, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)[2]
    manual = attn.proj((w @ v).transpose(1, 2).reshape(2, 1 + N, DIM))
    close(manual, attn(t))


def test_avg_pool_and_encoder(x: torch.Tensor) -> None:
    model = create_model(
        "vit_tiny_patch4_32", img_size=16, depth=2, embed_dim=48, global_pool="avg"
    ).eval()
    assert isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.LayerNorm)
    f = model.forward_features(x)
    close(model.fc_norm(model.forward_tokens(x)[:, 1:].mean(1)), f)
    enc = model.feature_extractor()
    close(enc(x), f)
    assert not {id(p) for p in model.head.parameters()} & {id(p) for p in enc.parameters()}
    with pytest.raises(ConfigError, match="global_pool 'max'"):
        create_model("vit_tiny_patch4_32", global_pool="max")


def test_bad_vit_configs_refused() -> None:
    with pytest.raises(ConfigError, match="not divisible by patch_size"):
        create_model("vit_tiny_patch4_32", img_size=30)
    with pytest.raises(ConfigError, match="divisible by num_heads"):
        create_model("vit_tiny_patch4_32", embed_dim=50, depth=1)
    model = create_model("vit_tiny_patch4_32", depth=1)
    with pytest.raises(ConfigError, match="img_size"):
        model(torch.rand(1, 3, 16, 16))
    with pytest.raises(ConfigError, match="in_chans"):
        model(torch.rand(1, 1, 32, 32))


def test_random_keep_idx() -> None:
    k1 = random_keep_idx(4, 64, 16, generator=torch.Generator().manual_seed(0))
    k2 = random_keep_idx(4, 64, 16, generator=torch.Generator().manual_seed(0))
    assert k1.shape == (4, 16) and k1.dtype == torch.long and torch.equal(k1, k2)
    assert (k1.diff(dim=1) > 0).all()  # sorted, no repeats
    assert k1.min() >= 0 and k1.max() < 64
    with pytest.raises(ConfigError, match="num_keep"):
        random_keep_idx(1, 8, 9)


def test_act_option_vit() -> None:
    model = create_model("vit_tiny_patch2_16", depth=1, act="relu")
    assert isinstance(model.blocks[0].mlp.act, nn.ReLU)
    assert isinstance(create_model("vit_tiny_patch2_16", depth=1).blocks[0].mlp.act, nn.GELU)


def test_register_tokens() -> None:
    """Registers sit between the class token and the patches, with no position
    embedding; ``keep_idx`` indexes patches only; avg pooling, token logits and
    attention maps leave them out."""
    torch.manual_seed(0)
    r = 3
    model = create_model(
        "vit_tiny_patch4_32", num_classes=C, img_size=16, depth=2, embed_dim=DIM, reg_tokens=r
    ).eval()
    nn.init.normal_(model.reg_token)
    assert model.state_dict()["reg_token"].shape == (1, r, DIM)
    assert model.num_prefix_tokens == 1 + r and "reg_token" in model.no_weight_decay()
    x = torch.randn(B, 3, 16, 16)
    tokens = model.embed(x)
    assert tokens.shape == (B, 1 + r + N, DIM)
    assert torch.equal(tokens[:, 1 : 1 + r], model.reg_token.expand(B, -1, -1))
    keep = random_keep_idx(B, N, 5, generator=torch.Generator().manual_seed(5))
    sparse = model.embed(x, keep_idx=keep)
    assert torch.equal(sparse[:, : 1 + r], tokens[:, : 1 + r])
    close(sparse[:, 1 + r :], tokens[:, 1 + r :].gather(1, keep.unsqueeze(-1).expand(-1, -1, DIM)))
    # the registers change the output (they take part in attention)
    plain = create_model(
        "vit_tiny_patch4_32", num_classes=C, img_size=16, depth=2, embed_dim=DIM
    ).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "reg_token"})
    assert not torch.allclose(plain(x), model(x))
    # token logits: class token + patches, registers left out
    out = model.forward_tokens(x)
    tl = model.token_logits(x)
    assert tl.shape == (B, 1 + N, C)
    close(tl[:, 1:], model.head(out[:, 1 + r :]))
    # attention maps: class-to-patch columns of the full attention
    blk = model.blocks[1]
    full = blk.attn.attention_weights(blk.norm1(model.blocks[:1](tokens)))[:, :, 0]
    close(model.attention_maps(x, average_heads=False), full[:, :, 1 + r :])
    # each row sums to 1 minus the class token's attention to itself and the registers
    close(model.attention_maps(x, average_heads=False).sum(-1), 1 - full[:, :, : 1 + r].sum(-1))
    # avg pooling averages the patch tokens only
    avg = create_model(
        "vit_tiny_patch4_32", img_size=16, depth=1, embed_dim=DIM, reg_tokens=r, global_pool="avg"
    ).eval()
    close(avg.forward_features(x), avg.fc_norm(avg.forward_tokens(x)[:, 1 + r :].mean(1)))
    close(avg.feature_extractor()(x), avg.forward_features(x))
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="reg_tokens"):
            create_model("vit_tiny_patch4_32", depth=1, reg_tokens=bad)


def test_dinov2_hyper_parameters() -> None:
    """timm's vit_{small,base}_patch14(_reg4)_dinov2: 518 px, patch 14, layer scale 1e-5."""
    small = create_model("dinov2_small", depth=1)
    assert small.patch_embed.patch_size == (14, 14) and small.patch_embed.grid_size == (37, 37)
    assert small.embed_dim == 384 and small.blocks[0].attn.num_heads == 6
    assert torch.equal(small.blocks[0].ls1.gamma, torch.full((384,), 1e-5))
    assert small.reg_token is None
    reg = create_model("dinov2_base_reg", depth=1, img_size=224)
    assert reg.embed_dim == 768 and reg.reg_token.shape == (1, 4, 768)
    assert reg.pos_embed.shape == (1, 1 + 16 * 16, 768)  # no position for registers
