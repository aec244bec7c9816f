"""PEFT modules: LoRA (incl. q/v slices of a fused qkv), VPT-shallow prompts,
seeded dropout, and that wrapping keeps the frozen parameters' names so
pretrained checkpoints still load."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.peft.lora import (
    LoRALinear,
    SeededDropout,
    add_lora,
    merge_lora,
    reset_lora,
    set_dropout_generator,
)
from osfl.methods.peft.prompts import add_prompt_tokens, reset_prompts
from osfl.models import create_model


def tiny_vit(**kw: object) -> nn.Module:
    torch.manual_seed(0)
    return create_model(
        "vit_tiny_patch2_16", img_size=8, in_chans=1, depth=2, embed_dim=32, num_heads=2, **kw
    )


def randomise_b(model: nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g))


def test_lora_starts_as_the_identity_and_keeps_frozen_names() -> None:
    model = tiny_vit().eval()
    x = torch.randn(4, 1, 8, 8)
    before = model(x)
    names = set(model.state_dict())
    wrapped = add_lora(model, ["attn.qkv"], rank=4, alpha=8.0, chunks=3, slices=(0, 2))
    reset_lora(model, torch.Generator().manual_seed(0))
    assert wrapped == ["blocks.0.attn.qkv", "blocks.1.attn.qkv"]
    assert torch.equal(model(x), before)  # B = 0: the adapted model is the pretrained one
    new = set(model.state_dict())
    assert names <= new
    assert new - names == {f"blocks.{i}.attn.qkv.lora_{ab}" for i in (0, 1) for ab in "AB"}
    qkv = model.blocks[0].attn.qkv
    assert qkv.lora_A.shape == (2, 4, 32) and qkv.lora_B.shape == (2, 32, 4)
    assert float(qkv.lora_A.detach().abs().sum()) > 0
    assert float(qkv.lora_B.detach().abs().sum()) == 0


def test_lora_on_q_and_v_leaves_the_key_slice_alone() -> None:
    lin = nn.Linear(6, 3 * 5)
    lora = LoRALinear(lin, rank=2, alpha=4.0, chunks=3, slices=(0, 2))
    lora.reset_lora(torch.Generator().manual_seed(0))
    with torch.no_grad():
        lora.lora_B.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(7, 6)
    with torch.no_grad():
        diff = (lora(x) - lin(x)).reshape(7, 3, 5)
    assert float(diff[:, 1].abs().max()) == 0.0  # k untouched
    assert float(diff[:, 0].abs().max()) > 0 and float(diff[:, 2].abs().max()) > 0
    expected_q = 2.0 * x @ lora.lora_A[0].T @ lora.lora_B[0].T  # alpha / r = 2
    torch.testing.assert_close(diff[:, 0], expected_q, rtol=1e-5, atol=1e-5)


def test_merged_lora_computes_the_same_function_as_a_plain_vit() -> None:
    model = tiny_vit().eval()
    add_lora(model, ["attn.proj", "mlp.fc2"], rank=3, alpha=6.0)
    reset_lora(model, torch.Generator().manual_seed(0))
    randomise_b(model)
    x = torch.randn(3, 1, 8, 8)
    adapted = model(x)
    merge_lora(model)
    assert not any("lora_" in k for k in model.state_dict())
    torch.testing.assert_close(model(x), adapted, rtol=1e-4, atol=1e-5)
    plain = tiny_vit().eval()
    plain.load_state_dict(model.state_dict(), strict=True)  # same names as an unwrapped ViT
    torch.testing.assert_close(plain(x), adapted, rtol=1e-4, atol=1e-5)


def test_pretrained_checkpoint_loads_into_the_model_before_and_after_wrapping(tmp_path) -> None:
    source = tiny_vit(num_classes=10)
    path = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    model = create_model(
        "vit_tiny_patch2_16",
        img_size=8,
        in_chans=1,
        depth=2,
        embed_dim=32,
        num_heads=2,
        num_classes=10,
        pretrained=str(path),
    )
    add_lora(model, ["attn.qkv"], rank=2, alpha=2.0, chunks=3, slices=(0, 2))
    state = model.state_dict()
    for k, v in source.state_dict().items():
        assert torch.equal(state[k], v), k
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    assert unexpected == [] and all("lora_" in k for k in missing)


def test_lora_refuses_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="rank"):
        LoRALinear(nn.Linear(4, 6), rank=0, alpha=1.0)
    with pytest.raises(ConfigError, match="chunks"):
        LoRALinear(nn.Linear(4, 7), rank=1, alpha=1.0, chunks=3)
    with pytest.raises(ConfigError, match="slices"):
        LoRALinear(nn.Linear(4, 6), rank=1, alpha=1.0, chunks=3, slices=(3,))
    with pytest.raises(ConfigError, match=r"no nn\.Linear"):
        add_lora(tiny_vit(), ["attn.nothing"], rank=1, alpha=1.0)


def test_seeded_dropout_is_a_function_of_its_generator() -> None:
    drop = SeededDropout(0.5).train()
    x = torch.ones(1000)
    drop.generator = torch.Generator().manual_seed(3)
    a = drop(x)
    drop.generator = torch.Generator().manual_seed(3)
    b = drop(x)
    assert torch.equal(a, b)
    assert set(a.unique().tolist()) == {0.0, 2.0}  # inverted dropout
    assert 400 < int((a == 0).sum()) < 600
    assert torch.equal(drop.eval()(x), x)
    model = tiny_vit()
    add_lora(model, ["mlp.fc2"], rank=1, alpha=1.0, dropout=0.1)
    g = torch.Generator()
    set_dropout_generator(model, g)
    assert all(m.generator is g for m in model.modules() if isinstance(m, SeededDropout))


def test_prompt_tokens_are_vpt_shallow_registers() -> None:
    model = tiny_vit().eval()
    names = set(model.state_dict())
    add_prompt_tokens(model, 5)
    reset_prompts(model, torch.Generator().manual_seed(0))
    assert set(model.state_dict()) - names == {"reg_token"}
    assert model.reg_token.shape == (1, 5, 32) and model.num_prefix_tokens == 6
    bound = (6.0 / (3 * 2 * 2 + 32)) ** 0.5
    assert float(model.reg_token.detach().abs().max()) <= bound
    x = torch.randn(2, 1, 8, 8)
    tokens = model.forward_tokens(x)
    assert tokens.shape == (2, 1 + 5 + 16, 32)
    assert model(x).shape == (2, 10)
    with pytest.raises(ConfigError, match="register"):
        add_prompt_tokens(model, 2)


def test_merged_keeps_the_bias_choice_and_the_dtype() -> None:
    """A base without a bias merges into a Linear without one; a float64 base
    into a float64 Linear, computing the same function."""
    torch.manual_seed(0)
    for bias in (False, True):
        base = nn.Linear(6, 4, bias=bias).double()
        lora = LoRALinear(base, rank=2, alpha=4.0)
        lora.reset_lora()
        with torch.no_grad():
            lora.lora_B.normal_()  # a non-zero update to merge
        lin = lora.merged()
        assert (lin.bias is None) == (not bias)
        assert lin.weight.dtype == torch.float64
        x = torch.randn(3, 6, dtype=torch.float64)
        with torch.no_grad():
            assert torch.allclose(lin(x), lora(x), atol=1e-12)


def test_merged_lives_where_the_lora_layer_does() -> None:
    from support.simulated_device import simulated_device

    torch.manual_seed(0)
    with simulated_device() as dev:
        lora = LoRALinear(nn.Linear(6, 4).to(dev), rank=2, alpha=4.0)
        lora.reset_lora()
        assert lora.merged().weight.device == dev
