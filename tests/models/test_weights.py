"""load_pretrained on checkpoints built in tmp_path (no downloads): timm names,
nesting/prefixes, Hugging Face names, another patch grid, another class count,
another input channel count, and refusals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from osfl.errors import ConfigError
from osfl.models import create_model, load_pretrained
from osfl.models.weights import adapt_input_conv, resample_pos_embed

SMALL = {"depth": 2, "embed_dim": 48, "num_heads": 3}


def vit(seed: int, **kw: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    args = {"img_size": 16, "num_classes": 5, **SMALL, **kw}
    return create_model("vit_tiny_patch4_32", **args).eval()


def save(sd: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def to_hf(sd: dict[str, torch.Tensor], prefix: str = "vit.") -> dict[str, torch.Tensor]:
    """timm names -> Hugging Face ViTForImageClassification names (qkv split)."""
    rules = [
        (r"cls_token", "embeddings.cls_token"),
        (r"pos_embed", "embeddings.position_embeddings"),
        (r"patch_embed\.proj\.(\w+)", r"embeddings.patch_embeddings.projection.\1"),
        (r"blocks\.(\d+)\.norm1\.(\w+)", r"encoder.layer.\1.layernorm_before.\2"),
        (r"blocks\.(\d+)\.attn\.proj\.(\w+)", r"encoder.layer.\1.attention.output.dense.\2"),
        (r"blocks\.(\d+)\.norm2\.(\w+)", r"encoder.layer.\1.layernorm_after.\2"),
        (r"blocks\.(\d+)\.mlp\.fc1\.(\w+)", r"encoder.layer.\1.intermediate.dense.\2"),
        (r"blocks\.(\d+)\.mlp\.fc2\.(\w+)", r"encoder.layer.\1.output.dense.\2"),
        (r"norm\.(\w+)", r"layernorm.\1"),
    ]
    out = {}
    for k, v in sd.items():
        m = re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(\w+)", k)
        if m:
            for name, part in zip(("query", "key", "value"), v.chunk(3, dim=0), strict=True):
                out[f"{prefix}encoder.layer.{m[1]}.attention.attention.{name}.{m[2]}"] = part
            continue
        if k.startswith("head."):
            out["classifier." + k[5:]] = v
            continue
        for pat, rep in rules:
            if re.fullmatch(pat, k):
                out[prefix + re.sub(pat, rep, k)] = v
                break
        else:
            raise AssertionError(k)
    return out


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        if not k.startswith(skip):
            assert torch.equal(sa[k], sb[k]), k


def test_safetensors_round_trip(tmp_path: Path) -> None:
    src, dst = vit(0), vit(1)
    path = save(src.state_dict(), tmp_path / "w.safetensors")
    report = load_pretrained(dst, path, strict=True)
    assert_same_weights(src, dst)
    assert report.format == "timm"
    assert not (report.missing_keys or report.unexpected_keys or report.dropped_keys)
    assert len(report.loaded) == len(src.state_dict())
    assert "0 missing" in report.summary()


def test_nested_pth_with_module_prefix(tmp_path: Path) -> None:
    src, dst = vit(0), vit(1)
    nested = {"epoch": 3, "model": {"module." + k: v for k, v in src.state_dict().items()}}
    torch.save(nested, tmp_path / "ckpt.pth")
    load_pretrained(dst, tmp_path / "ckpt.pth", strict=True)
    assert_same_weights(src, dst)


def test_huggingface_names(tmp_path: Path) -> None:
    src, dst = vit(0), vit(1)
    hf = to_hf(src.state_dict())
    hf["vit.pooler.dense.weight"] = torch.zeros(48, 48)  # HF-only; dropped and reported
    path = save(hf, tmp_path / "model.safetensors")
    report = load_pretrained(dst, path, strict=True)
    assert report.format == "huggingface"
    assert report.dropped_keys == ("vit.pooler.dense.weight",)
    assert not report.unexpected_keys
    assert_same_weights(src, dst)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(dst(x), src(x))
    # a bare ViTModel (no "vit." prefix, no classifier) loads too, head left as is
    head_before = vit(2).head.weight.clone()
    bare = {k: v for k, v in to_hf(src.state_dict(), prefix="").items() if "classifier" not in k}
    dst2 = vit(2)
    report2 = load_pretrained(dst2, save(bare, tmp_path / "bare.safetensors"))
    assert set(report2.missing_keys) == {"head.weight", "head.bias"}
    assert torch.equal(dst2.head.weight, head_before)
    with pytest.raises(ConfigError, match="missing"):
        load_pretrained(vit(2), tmp_path / "bare.safetensors", strict=True)


def test_grid_change_resamples_pos_embed(tmp_path: Path) -> None:
    src = vit(0, img_size=32)  # 8x8 grid
    dst = vit(1, img_size=16)  # 4x4 grid
    report = load_pretrained(dst, save(src.state_dict(), tmp_path / "w.safetensors"))
    assert "pos_embed: grid 8x8 -> 4x4" in report.adapted
    assert dst.pos_embed.shape == (1, 17, 48)
    assert torch.equal(dst.pos_embed[:, 0], src.pos_embed[:, 0])  # class token kept
    assert_same_weights(src, dst, skip=("pos_embed",))
    assert torch.isfinite(dst(torch.randn(1, 3, 16, 16))).all()


def test_resample_pos_embed_by_hand() -> None:
    # a constant field stays constant under (antialiased) bicubic resampling
    const = torch.cat([torch.full((1, 1, 4), 7.0), torch.full((1, 16, 4), 2.5)], dim=1)
    for grid in ((2, 2), (8, 8), (3, 5)):
        out = resample_pos_embed(const, grid, num_prefix=1)
        assert out.shape == (1, 1 + grid[0] * grid[1], 4)
        assert torch.equal(out[:, 0], const[:, 0])
        torch.testing.assert_close(out[:, 1:], torch.full_like(out[:, 1:], 2.5))
    same = torch.randn(1, 17, 4)
    assert torch.equal(resample_pos_embed(same, (4, 4), 1), same)
    # a distillation token (second prefix) is dropped; no class token -> zeros
    with_dist = torch.randn(1, 18, 4)
    assert torch.equal(resample_pos_embed(with_dist, (4, 4), 2), with_dist[:, [0, *range(2, 18)]])
    no_cls = resample_pos_embed(torch.randn(1, 16, 4), (4, 4), 0)
    assert torch.equal(no_cls[:, 0], torch.zeros(1, 4))


def test_deit_distilled_checkpoint(tmp_path: Path) -> None:
    src, dst = vit(0), vit(1)
    sd = dict(src.state_dict())
    sd["dist_token"] = torch.randn(1, 1, 48)
    pe = sd["pos_embed"]
    sd["pos_embed"] = torch.cat([pe[:, :1], torch.randn(1, 1, 48), pe[:, 1:]], dim=1)
    sd["head_dist.weight"] = torch.randn(5, 48)
    report = load_pretrained(dst, save(sd, tmp_path / "deit.safetensors"))
    assert "dist_token" in report.dropped_keys
    assert report.unexpected_keys == ("head_dist.weight",)
    assert_same_weights(src, dst)


def test_head_with_other_class_count(tmp_path: Path) -> None:
    src, dst = vit(0, num_classes=10), vit(1, num_classes=5)
    head_before = dst.head.weight.clone()
    path = save(src.state_dict(), tmp_path / "w.safetensors")
    report = load_pretrained(dst, path, strict=True)  # a dropped head is not "missing"
    assert set(report.dropped_keys) == {"head.weight", "head.bias"}
    assert torch.equal(dst.head.weight, head_before)
    for k, v in dst.state_dict().items():
        if not k.startswith("head."):
            assert torch.equal(v, src.state_dict()[k]), k
    with pytest.raises(ConfigError, match=r"'head\.(weight|bias)' has 10 classes"):
        load_pretrained(vit(1), path, num_classes_mismatch="error")
    with pytest.raises(ConfigError, match="num_classes_mismatch"):
        load_pretrained(vit(1), path, num_classes_mismatch="keep")


def test_other_embed_dim_refused_naming_the_key(tmp_path: Path) -> None:
    path = save(vit(0).state_dict(), tmp_path / "w.safetensors")
    other = vit(1, embed_dim=96)
    with pytest.raises(ConfigError, match=r"'cls_token' has shape \(1, 1, 48\).*\(1, 1, 96\)"):
        load_pretrained(other, path)


def test_grey_model_from_rgb_checkpoint(tmp_path: Path) -> None:
    """Summing the RGB filters: a grey image in the 1-channel model gives what the
    same image copied to 3 channels gives in the RGB model."""
    for name, kw, size in (("vit", SMALL, 16), ("resnet18", {}, 8)):
        torch.manual_seed(0)
        if name == "vit":
            src, dst = vit(0), vit(1, in_chans=1)
        else:
            src = create_model(name, num_classes=5, **kw).eval()
            dst = create_model(name, num_classes=5, in_chans=1, **kw).eval()
        report = load_pretrained(dst, save(src.state_dict(), tmp_path / f"{name}.safetensors"))
        assert any("input channels 3 -> 1" in n for n in report.adapted)
        g = torch.rand(2, 1, size, size)
        torch.testing.assert_close(dst(g), src(g.expand(-1, 3, -1, -1)), atol=1e-4, rtol=1e-4)


def test_adapt_input_conv_rule() -> None:
    w = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(adapt_input_conv(w, 1), w.sum(1, keepdim=True))
    w4 = adapt_input_conv(w, 4)
    torch.testing.assert_close(w4[:, :3], w * 0.75)
    torch.testing.assert_close(w4[:, 3], w[:, 0] * 0.75)
    with pytest.raises(ConfigError, match="2-channel"):
        adapt_input_conv(torch.randn(4, 2, 2, 2), 4)


def test_cnn_pt_round_trip_and_create_model_pretrained(tmp_path: Path) -> None:
    src = create_model("cnn_small", num_classes=4)
    torch.save({"state_dict": src.state_dict()}, tmp_path / "cnn.pt")
    dst = create_model("cnn_small", num_classes=4, pretrained=tmp_path / "cnn.pt")
    assert_same_weights(src, dst)


class _NotATensor:
    pass


def test_refusals(tmp_path: Path) -> None:
    model = vit(0)
    with pytest.raises(ConfigError, match="not found"):
        load_pretrained(model, tmp_path / "missing.safetensors")
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"unknown format '\.npz'"):
        load_pretrained(model, tmp_path / "w.npz")
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="not a valid safetensors"):
        load_pretrained(model, tmp_path / "bad.safetensors")
    # a pickle that needs code is refused, never executed (weights_only=True)
    torch.save({"obj": _NotATensor(), "w": torch.zeros(1)}, tmp_path / "evil.pth")
    with pytest.raises(ConfigError, match="weights_only"):
        load_pretrained(model, tmp_path / "evil.pth")
    torch.save({"epoch": 1}, tmp_path / "empty.pt")
    with pytest.raises(ConfigError, match="no tensors"):
        load_pretrained(model, tmp_path / "empty.pt")
    # an unrelated architecture shares no key with the model
    cnn = save(create_model("cnn_small").state_dict(), tmp_path / "cnn.safetensors")
    with pytest.raises(ConfigError, match="shares no parameter name"):
        load_pretrained(model, cnn)
    # strict refuses unexpected keys
    sd = dict(model.state_dict())
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(ConfigError, match=r"extra\.weight"):
        load_pretrained(vit(1), save(sd, tmp_path / "extra.safetensors"), strict=True)
