"""Real checkpoint layouts, offline: Hugging Face ViT / DINOv2 (with and without
registers), facebookresearch DINOv2 originals, timm's DINOv2-reg layout and
torchvision ResNets.

Each checkpoint is written in tmp_path from a tiny model built here, renamed
by :func:`export_state_dict`. Exporter and loader could share a naming mistake,
so the exported key names are pinned against the published ones (typed out
from ``transformers``' ``modeling_vit.py`` / ``modeling_dinov2.py``,
facebookresearch/dinov2 and ``torchvision/models/resnet.py``), and the
exported file is run through a functional re-implementation of the original
forward written here from those names, which the loaded model must match.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from osfl.errors import ConfigError
from osfl.models import create_model, export_state_dict, list_models, load_pretrained
from support.paths import ROOT

SD = dict[str, torch.Tensor]
HEADS = 2
VIT_TINY = {"depth": 2, "embed_dim": 32, "num_heads": HEADS, "num_classes": 5}


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Every weight and BN statistic random and O(1): layer scale's 1e-5 init
    would otherwise hide a wrong attention or MLP mapping."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                r = torch.randn(t.shape, generator=g) * 0.5
                t.copy_(r.abs() + 0.5 if name.endswith("running_var") else r)
    return model.eval()


def dinov2(seed: int, reg: int = 0, **kw: object) -> nn.Module:
    name = "dinov2_small_reg" if reg else "dinov2_small"
    args = {"img_size": 28, **VIT_TINY, **({"reg_tokens": reg} if reg else {}), **kw}
    return randomize(create_model(name, **args), seed)


def vit16(seed: int, **kw: object) -> nn.Module:
    args = {"img_size": 32, **VIT_TINY, **kw}
    return randomize(create_model("vit_base_patch16_224", **args), seed)


def save(sd: SD, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def images(size: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(7))


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


# --- functional references, written from each layout's own names --------------------
def _attn(x: torch.Tensor, q: tuple, k: tuple, v: tuple, o: tuple) -> torch.Tensor:
    b, n, d = x.shape
    qh, kh, vh = (F.linear(x, *p).view(b, n, HEADS, d // HEADS).transpose(1, 2) for p in (q, k, v))
    a = (qh @ kh.transpose(-1, -2) / math.sqrt(d // HEADS)).softmax(-1)
    return F.linear((a @ vh).transpose(1, 2).reshape(b, n, d), *o)


def _patches(sd: SD, x: torch.Tensor, conv: str) -> torch.Tensor:
    w = sd[conv + ".weight"]
    return F.conv2d(x, w, sd[conv + ".bias"], stride=w.shape[-1]).flatten(2).transpose(1, 2)


def hf_reference(sd: SD, x: torch.Tensor, eps: float) -> torch.Tensor:
    """``ViTModel`` / ``Dinov2Model`` / ``Dinov2WithRegistersModel`` class token
    after the final layernorm (``pooler_output`` of DINOv2)."""
    p = "vit." if "vit.embeddings.cls_token" in sd else ""
    t = _patches(sd, x, p + "embeddings.patch_embeddings.projection")
    cls = sd[p + "embeddings.cls_token"].expand(len(x), -1, -1)
    t = torch.cat([cls, t], 1) + sd[p + "embeddings.position_embeddings"]
    if p + "embeddings.register_tokens" in sd:
        reg = sd[p + "embeddings.register_tokens"].expand(len(x), -1, -1)
        t = torch.cat([t[:, :1], reg, t[:, 1:]], 1)
    d = t.shape[-1]
    i = 0
    while f"{p}encoder.layer.{i}.attention.output.dense.weight" in sd:
        L = f"{p}encoder.layer.{i}."

        def w(name: str, L: str = L) -> tuple[torch.Tensor, torch.Tensor]:
            return sd[L + name + ".weight"], sd[L + name + ".bias"]

        dino = L + "norm1.weight" in sd
        ln1, ln2 = ("norm1", "norm2") if dino else ("layernorm_before", "layernorm_after")
        fc1, fc2 = ("mlp.fc1", "mlp.fc2") if dino else ("intermediate.dense", "output.dense")
        ls1 = sd[L + "layer_scale1.lambda1"] if dino else 1.0
        ls2 = sd[L + "layer_scale2.lambda1"] if dino else 1.0
        qkv = [w(f"attention.attention.{n}") for n in ("query", "key", "value")]
        h = F.layer_norm(t, (d,), *w(ln1), eps=eps)
        t = t + ls1 * _attn(h, *qkv, w("attention.output.dense"))
        h = F.layer_norm(t, (d,), *w(ln2), eps=eps)
        t = t + ls2 * F.linear(F.gelu(F.linear(h, *w(fc1))), *w(fc2))
        i += 1
    t = F.layer_norm(t, (d,), sd[p + "layernorm.weight"], sd[p + "layernorm.bias"], eps=eps)
    return t[:, 0]


def timm_reference(sd: SD, x: torch.Tensor) -> torch.Tensor:
    """timm / facebookresearch-dinov2 ViT class token after ``norm``: registers
    are ``register_tokens`` (dinov2, after adding positions) or ``reg_token``
    (timm, ``no_embed_class``: positions on patches only)."""
    t = _patches(sd, x, "patch_embed.proj")
    cls = sd["cls_token"].expand(len(x), -1, -1)
    if "reg_token" in sd:  # timm no_embed_class
        t = torch.cat([cls, sd["reg_token"].expand(len(x), -1, -1), t + sd["pos_embed"]], 1)
    else:
        t = torch.cat([cls, t], 1) + sd["pos_embed"]
        if "register_tokens" in sd:
            reg = sd["register_tokens"].expand(len(x), -1, -1)
            t = torch.cat([t[:, :1], reg, t[:, 1:]], 1)
    d = t.shape[-1]
    i = 0
    while f"blocks.{i}.attn.qkv.weight" in sd:
        B = f"blocks.{i}."

        def w(name: str, B: str = B) -> tuple[torch.Tensor, torch.Tensor]:
            return sd[B + name + ".weight"], sd[B + name + ".bias"]

        qw, qb = w("attn.qkv")
        qkv = list(zip(qw.chunk(3), qb.chunk(3), strict=True))
        h = F.layer_norm(t, (d,), *w("norm1"), eps=1e-6)
        t = t + sd[B + "ls1.gamma"] * _attn(h, *qkv, w("attn.proj"))
        h = F.layer_norm(t, (d,), *w("norm2"), eps=1e-6)
        t = t + sd[B + "ls2.gamma"] * F.linear(F.gelu(F.linear(h, *w("mlp.fc1"))), *w("mlp.fc2"))
        i += 1
    return F.layer_norm(t, (d,), sd["norm.weight"], sd["norm.bias"], eps=1e-6)[:, 0]


def torchvision_resnet_reference(sd: SD, x: torch.Tensor) -> torch.Tensor:
    """``torchvision.models.ResNet.forward`` (v1.5 Bottleneck: stride in conv2)."""

    def bn(t: torch.Tensor, p: str) -> torch.Tensor:
        return F.batch_norm(
            t, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"], sd[p + ".bias"]
        )

    def conv(t: torch.Tensor, p: str, stride: int = 1) -> torch.Tensor:
        w = sd[p + ".weight"]
        return F.conv2d(t, w, stride=stride, padding=w.shape[-1] // 2)

    x = F.max_pool2d(F.relu(bn(conv(x, "conv1", 2), "bn1")), 3, 2, 1)
    for stage in range(1, 5):
        j = 0
        while f"layer{stage}.{j}.conv1.weight" in sd:
            p = f"layer{stage}.{j}"
            stride = 2 if stage > 1 and j == 0 else 1
            if p + ".conv3.weight" in sd:
                out = F.relu(bn(conv(x, p + ".conv1"), p + ".bn1"))
                out = F.relu(bn(conv(out, p + ".conv2", stride), p + ".bn2"))
                out = bn(conv(out, p + ".conv3"), p + ".bn3")
            else:
                out = F.relu(bn(conv(x, p + ".conv1", stride), p + ".bn1"))
                out = bn(conv(out, p + ".conv2"), p + ".bn2")
            short = x
            if p + ".downsample.0.weight" in sd:
                short = bn(conv(x, p + ".downsample.0", stride), p + ".downsample.1")
            x = F.relu(out + short)
            j += 1
    return F.linear(x.mean(dim=(2, 3)), sd["fc.weight"], sd["fc.bias"])


# --- pinned published key names (depth-1 models) ----------------------------------
def _hf_layer(p: str, dino: bool) -> set[str]:
    names = ["attention.attention.query", "attention.attention.key", "attention.attention.value"]
    names += ["attention.output.dense"]
    if dino:
        names += ["norm1", "norm2", "mlp.fc1", "mlp.fc2"]
    else:
        names += ["layernorm_before", "layernorm_after", "intermediate.dense", "output.dense"]
    out = {f"{p}encoder.layer.0.{n}.{wb}" for n in names for wb in ("weight", "bias")}
    if dino:
        out |= {f"{p}encoder.layer.0.layer_scale{i}.lambda1" for i in (1, 2)}
    return out


def test_exported_names_are_the_published_ones() -> None:
    emb = {"embeddings.cls_token", "embeddings.position_embeddings"}
    emb |= {f"embeddings.patch_embeddings.projection.{wb}" for wb in ("weight", "bias")}
    final = {"layernorm.weight", "layernorm.bias"}
    # google/vit-base-patch16-224 (ViTForImageClassification)
    vit = set(export_state_dict(vit16(0, depth=1), "huggingface"))
    expected = {"vit." + k for k in emb | final} | _hf_layer("vit.", dino=False)
    assert vit == expected | {"classifier.weight", "classifier.bias"}
    # facebook/dinov2-small (Dinov2Model) and facebook/dinov2-with-registers-small
    dino = set(export_state_dict(dinov2(0, depth=1), "huggingface"))
    assert dino == emb | final | _hf_layer("", dino=True) | {"embeddings.mask_token"}
    dino_reg = set(export_state_dict(dinov2(0, reg=4, depth=1), "huggingface"))
    assert dino_reg == dino | {"embeddings.register_tokens"}
    # facebookresearch/dinov2 dinov2_vits14_reg4_pretrain.pth
    fb = set(export_state_dict(dinov2(0, reg=4, depth=1), "dinov2"))
    blk = ["norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"]
    assert fb == (
        {"cls_token", "pos_embed", "mask_token", "register_tokens", "norm.weight", "norm.bias"}
        | {f"patch_embed.proj.{wb}" for wb in ("weight", "bias")}
        | {f"blocks.0.{n}.{wb}" for n in blk for wb in ("weight", "bias")}
        | {"blocks.0.ls1.gamma", "blocks.0.ls2.gamma"}
    )
    # torchvision resnet50: names are this project's own
    tv = set(create_model("tv_resnet50", width=8).state_dict())
    for key in (
        "conv1.weight",
        "bn1.running_var",
        "layer1.0.conv3.weight",
        "layer1.0.downsample.0.weight",
        "layer1.0.downsample.1.bias",
        "layer4.2.bn3.weight",
        "fc.bias",
    ):
        assert key in tv, key


# --- each layout loads and computes what the original computes ---------------------
@pytest.mark.parametrize("reg", [0, 4])
def test_huggingface_dinov2(tmp_path: Path, reg: int) -> None:
    src = dinov2(0, reg)
    hf = export_state_dict(src, "huggingface")
    x = images(28)
    ref = hf_reference(hf, x, eps=1e-6)
    close(src.forward_features(x), ref)  # the export is faithful ...
    dst = dinov2(1, reg)
    report = load_pretrained(dst, save(hf, tmp_path / "model.safetensors"))
    close(dst.forward_features(x), ref)  # ... and so is the load
    assert report.format == "huggingface"
    assert "embeddings.mask_token" in report.dropped_keys
    assert set(report.missing_keys) == {"head.weight", "head.bias"}  # Dinov2Model has no head
    assert not report.unexpected_keys


def test_huggingface_dinov2_for_image_classification(tmp_path: Path) -> None:
    """``dinov2.`` prefix; its classifier reads 2·D features, so it is dropped."""
    src = dinov2(0)
    hf = {"dinov2." + k: v for k, v in export_state_dict(src, "huggingface").items()}
    hf["classifier.weight"], hf["classifier.bias"] = torch.randn(5, 64), torch.randn(5)
    dst = dinov2(1)
    report = load_pretrained(dst, save(hf, tmp_path / "cls.safetensors"))
    assert {"classifier.weight", "classifier.bias"} <= set(report.dropped_keys)
    x = images(28)
    close(dst.forward_features(x), src.forward_features(x))


def test_huggingface_vit(tmp_path: Path) -> None:
    src = vit16(0)
    hf = export_state_dict(src, "huggingface")
    x = images(32)
    ref = hf_reference(hf, x, eps=1e-12)  # transformers' ViT layer_norm_eps
    logits = F.linear(ref, hf["classifier.weight"], hf["classifier.bias"])
    close(src(x), logits, tol=1e-4)
    # ViTForImageClassification
    dst = vit16(1)
    report = load_pretrained(dst, save(hf, tmp_path / "model.safetensors"), strict=True)
    close(dst(x), logits, tol=1e-4)
    assert report.format == "huggingface"
    # a bare ViTModel with its pooler (google/vit-base-patch16-224-in21k's layout)
    bare = {k[len("vit.") :]: v for k, v in hf.items() if k.startswith("vit.")}
    bare["pooler.dense.weight"], bare["pooler.dense.bias"] = torch.randn(32, 32), torch.zeros(32)
    dst2 = vit16(2)
    head = dst2.head.weight.clone()
    report2 = load_pretrained(dst2, save(bare, tmp_path / "bare.safetensors"))
    assert set(report2.dropped_keys) == {"pooler.dense.weight", "pooler.dense.bias"}
    assert set(report2.missing_keys) == {"head.weight", "head.bias"}
    assert torch.equal(dst2.head.weight, head)
    close(dst2.forward_features(x), ref, tol=1e-4)


@pytest.mark.parametrize("reg", [0, 4])
def test_facebookresearch_dinov2(tmp_path: Path, reg: int) -> None:
    src = dinov2(0, reg)
    fb = export_state_dict(src, "dinov2")
    x = images(28)
    ref = timm_reference(fb, x)
    close(src.forward_features(x), ref)
    dst = dinov2(1, reg)
    torch.save(fb, tmp_path / f"dinov2_vits14{'_reg4' if reg else ''}_pretrain.pth")
    report = load_pretrained(dst, next(tmp_path.glob("*.pth")))
    close(dst.forward_features(x), ref)
    assert report.format == "dinov2" and report.dropped_keys == ("mask_token",)


@pytest.mark.parametrize("reg", [0, 4])
def test_timm_dinov2(tmp_path: Path, reg: int) -> None:
    """timm's vit_small_patch14_dinov2 (no mask_token) and *_reg4_dinov2 (class
    position folded into cls_token, pos_embed without it)."""
    src = dinov2(0, reg)
    sd = export_state_dict(src, "timm")
    assert sd["pos_embed"].shape[1] == (4 if reg else 5)
    x = images(28)
    ref = timm_reference(sd, x)
    close(src.forward_features(x), ref)
    dst = dinov2(1, reg)
    report = load_pretrained(dst, save(sd, tmp_path / "model.safetensors"))
    close(dst.forward_features(x), ref)
    assert report.format == "timm"
    assert any("no_embed_class" in n for n in report.adapted) == bool(reg)


@pytest.mark.parametrize("name", ["tv_resnet18", "tv_resnet50"])
def test_torchvision_resnet(tmp_path: Path, name: str) -> None:
    src = randomize(create_model(name, width=8), 0)
    # torchvision's published files predate num_batches_tracked
    sd = {k: v for k, v in src.state_dict().items() if "num_batches_tracked" not in k}
    torch.save(sd, tmp_path / f"{name}.pth")
    x = images(64)
    ref = torchvision_resnet_reference(sd, x)
    close(src(x), ref, tol=1e-4)
    dst = randomize(create_model(name, width=8), 1)
    report = load_pretrained(dst, tmp_path / f"{name}.pth", strict=True)
    close(dst(x), ref, tol=1e-4)
    assert report.format == "timm" and not report.missing_keys
    # the CIFAR ResNet (3x3 stem) refuses it and says what to build instead
    cifar = create_model(name.removeprefix("tv_"), width=8, num_classes=1000)
    with pytest.raises(ConfigError, match=r"'conv1\.weight' has shape.*stem='imagenet'"):
        load_pretrained(cifar, tmp_path / f"{name}.pth")


def test_position_embeddings_resampled_to_another_size(tmp_path: Path) -> None:
    """A 2x2-grid DINOv2 checkpoint into a 4x4-grid model (56 px): bicubic
    resampling, class position kept, registers loaded as they are."""
    src = dinov2(0, reg=4)
    path = save(export_state_dict(src, "huggingface"), tmp_path / "model.safetensors")
    dst = dinov2(1, reg=4, img_size=56)
    report = load_pretrained(dst, path)
    assert "pos_embed: grid 2x2 -> 4x4" in report.adapted
    assert dst.pos_embed.shape == (1, 17, 32)
    assert torch.equal(dst.pos_embed[:, 0], src.pos_embed[:, 0])
    assert torch.equal(dst.reg_token, src.reg_token)
    assert torch.isfinite(dst(images(56))).all()


# --- refusals ------------------------------------------------------------------------
LAYOUT_CASES: dict[str, tuple[Callable[[], nn.Module], str, str]] = {
    # layout -> (model, a key of that layout, that key's name in this project)
    "huggingface": (
        lambda: dinov2(0),
        "encoder.layer.0.layer_scale1.lambda1",
        "blocks.0.ls1.gamma",
    ),
    "dinov2": (lambda: dinov2(0, reg=4), "register_tokens", "reg_token"),
    "timm": (lambda: randomize(create_model("tv_resnet18", width=8), 0), "fc.weight", "fc.weight"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUT_CASES))
def test_wrong_shape_missing_key_and_pickle_refused(tmp_path: Path, layout: str) -> None:
    make, key, ours = LAYOUT_CASES[layout]
    sd = export_state_dict(make(), layout)
    # wrong shape: the error names the key as the file has it
    bad = dict(sd)
    bad[key] = torch.cat([bad[key], bad[key]], dim=-1)
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}.*has shape"):
        load_pretrained(make(), save(bad, tmp_path / "shape.safetensors"))
    # missing key: strict names it; lenient loads the rest and reports it
    gone = {k: v for k, v in sd.items() if k != key}
    path = save(gone, tmp_path / "missing.safetensors")
    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError, match=rf"missing \[.*'{ours.replace('.', '[.]')}'"):
        load_pretrained(model, path, strict=True, layout=layout)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
    assert ours in load_pretrained(make(), path, layout=layout).missing_keys
    # pickle-only: a .pth that needs arbitrary unpickling is refused, never run
    torch.save({**sd, "config": _Config()}, tmp_path / "pickled.pth")
    with pytest.raises(ConfigError, match="pickle-only"):
        load_pretrained(make(), tmp_path / "pickled.pth")


class _Config:
    """A custom class: unpickling it would need arbitrary code."""


def test_hf_qkv_part_missing_names_it(tmp_path: Path) -> None:
    hf = export_state_dict(dinov2(0), "huggingface")
    del hf["encoder.layer.1.attention.attention.key.bias"]
    with pytest.raises(ConfigError, match=r"'encoder\.layer\.1\.attention\.attention\.key\.bias'"):
        load_pretrained(dinov2(1), save(hf, tmp_path / "m.safetensors"))


@pytest.mark.parametrize(
    "key",
    ["encoder.layer.0.mlp.weights_in.weight", "blocks.0.mlp.w12.weight"],
)
def test_swiglu_giant_refused(tmp_path: Path, key: str) -> None:
    layout = "huggingface" if key.startswith("encoder") else "dinov2"
    sd = export_state_dict(dinov2(0), layout)
    sd[key] = torch.zeros(4, 32)
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}.*SwiGLU"):
        load_pretrained(dinov2(1), save(sd, tmp_path / "g.safetensors"))


def test_other_architecture_refused_not_half_loaded(tmp_path: Path) -> None:
    """Registers or layer scale the model lacks would silently change what it computes."""
    reg = save(export_state_dict(dinov2(0, reg=4), "huggingface"), tmp_path / "reg.safetensors")
    with pytest.raises(ConfigError, match=r"'embeddings\.register_tokens'.*reg_tokens=R"):
        load_pretrained(dinov2(1), reg)
    with pytest.raises(ConfigError, match=r"'reg_token'.*has shape \(1, 4, 32\).*\(1, 2, 32\)"):
        load_pretrained(dinov2(1, reg=2), reg)
    ls = save(export_state_dict(dinov2(0), "dinov2"), tmp_path / "ls.safetensors")
    args = {**VIT_TINY, "patch_size": 14, "img_size": 28}
    plain = randomize(create_model("vit_tiny_patch4_32", **args), 1)
    with pytest.raises(ConfigError, match=r"'blocks\.0\.ls1\.gamma'.*init_values"):
        load_pretrained(plain, ls)


def test_layout_can_be_named_and_unknown_names_refused(tmp_path: Path) -> None:
    path = save(export_state_dict(dinov2(0), "huggingface"), tmp_path / "m.safetensors")
    assert load_pretrained(dinov2(1), path, layout="huggingface").format == "huggingface"
    with pytest.raises(ConfigError, match=r"unknown checkpoint layout 'keras'.*huggingface"):
        load_pretrained(dinov2(1), path, layout="keras")
    with pytest.raises(ConfigError, match="no Hugging Face ViT name"):
        export_state_dict(
            create_model("vit_tiny_patch4_32", global_pool="avg", depth=1), "huggingface"
        )


# --- every registered pretrained-checkpoint model, in every layout it is published in --
_PRETRAINED: dict[str, tuple[dict[str, object], tuple[str, ...]]] = {
    "dinov2_small": ({"img_size": 28}, ("timm", "dinov2", "huggingface")),
    "dinov2_base": ({"img_size": 28}, ("timm", "dinov2", "huggingface")),
    "dinov2_large": ({"img_size": 28}, ("timm", "dinov2", "huggingface")),
    "dinov2_small_reg": ({"img_size": 28}, ("timm", "dinov2", "huggingface")),
    "dinov2_base_reg": ({"img_size": 28}, ("timm", "dinov2", "huggingface")),
    "vit_base_patch16_224": ({"img_size": 32}, ("timm", "huggingface")),
    "deit_tiny_patch16_224": ({"img_size": 32}, ("timm", "huggingface")),
    "tv_resnet18": ({"width": 8}, ("timm",)),
    "tv_resnet50": ({"width": 8}, ("timm",)),
}


def test_pretrained_table_covers_the_registry() -> None:
    assert set(list_models("dinov2_*")) | set(list_models("tv_*")) <= set(_PRETRAINED)
    assert set(_PRETRAINED) <= set(list_models())


@pytest.mark.parametrize(
    ("name", "layout"), [(n, lay) for n, (_, lays) in _PRETRAINED.items() for lay in lays]
)
def test_registered_models_round_trip(tmp_path: Path, name: str, layout: str) -> None:
    kw, _ = _PRETRAINED[name]
    small = {"depth": 1, "num_classes": 5} if "resnet" not in name else {"num_classes": 5}
    src = randomize(create_model(name, **small, **kw), 0)
    dst = randomize(create_model(name, **small, **kw), 1)
    report = load_pretrained(dst, save(export_state_dict(src, layout), tmp_path / "w.safetensors"))
    assert report.format == layout
    x = images(int(kw.get("img_size", 32)))
    close(dst.forward_features(x), src.forward_features(x), tol=1e-4)
    if "head.weight" not in report.missing_keys:  # dinov2 / Dinov2Model exports carry no head
        close(dst(x), src(x), tol=1e-4)


def test_docs_example_runs() -> None:
    """docs/models.md's stand-in example runs as written."""
    text = (ROOT / "docs" / "models.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[-1]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/models.md", "exec"), namespace)
    report = namespace["report"]
    assert report.format == "huggingface" and "pos_embed: grid 2x2 -> 4x4" in report.adapted
