"""Hugging Face ``transformers`` ViT / DeiT / DINOv2 checkpoints.

Names from ``transformers/models/vit/modeling_vit.py`` (and
``convert_vit_timm_to_pytorch.py``), ``deit/modeling_deit.py``,
``dinov2/modeling_dinov2.py`` (and ``convert_dinov2_to_hf.py``) and
``dinov2_with_registers/modeling_dinov2_with_registers.py``, each converter run
backwards:

==========================================================  ===========================
Hugging Face                                                this project (timm)
==========================================================  ===========================
``embeddings.cls_token`` / ``.position_embeddings``         ``cls_token`` / ``pos_embed``
``embeddings.patch_embeddings.projection``                  ``patch_embed.proj``
``embeddings.register_tokens`` (DINOv2 with registers)      ``reg_token``
``embeddings.mask_token`` (DINOv2, masked pretraining)      dropped
``embeddings.distillation_token`` (DeiT)                    ``dist_token``
``encoder.layer.{i}.layernorm_before`` / ``.norm1``         ``blocks.{i}.norm1``
``...attention.attention.query/key/value``                  ``blocks.{i}.attn.qkv`` (q, k, v)
``...attention.output.dense``                               ``blocks.{i}.attn.proj``
``...layer_scale1.lambda1`` / ``layer_scale2.lambda1``      ``blocks.{i}.ls1/ls2.gamma``
``...layernorm_after`` / ``.norm2``                         ``blocks.{i}.norm2``
``...intermediate.dense`` / ``.mlp.fc1``                    ``blocks.{i}.mlp.fc1``
``...output.dense`` / ``.mlp.fc2``                          ``blocks.{i}.mlp.fc2``
``layernorm``                                               ``norm``
``pooler.dense`` (``ViTModel``'s tanh pooler)               dropped
``classifier`` / ``cls_classifier``                         ``head``
==========================================================  ===========================

Any of ``vit.``, ``deit.``, ``dinov2.``, ``dinov2_with_registers.`` prefixes
(the ``*ForImageClassification`` wrappers) is accepted. DINOv2's classifier
reads [class token, mean patch token] (2·D inputs), which this project's
head does not, so it is dropped. SwiGLU MLPs (``mlp.weights_in/out``,
DINOv2-giant) are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from osfl.errors import ConfigError
from osfl.models.layouts.base import (
    Converted,
    Layout,
    StateDict,
    refuse_swiglu,
    register_layout,
    zero_mask_token,
)

_PREFIX = r"(?:vit\.|deit\.|dinov2\.|dinov2_with_registers\.)?"
_LAYER = r"encoder\.layer\.(\d+)\."
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(_PREFIX + pat + r"$"), rep)
    for pat, rep in (
        (r"embeddings\.cls_token", "cls_token"),
        (r"embeddings\.distillation_token", "dist_token"),
        (r"embeddings\.register_tokens", "reg_token"),
        (r"embeddings\.position_embeddings", "pos_embed"),
        (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
        (_LAYER + r"(?:layernorm_before|norm1)\.(weight|bias)", r"blocks.\1.norm1.\2"),
        (_LAYER + r"attention\.output\.dense\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
        (_LAYER + r"layer_scale1\.lambda1", r"blocks.\1.ls1.gamma"),
        (_LAYER + r"(?:layernorm_after|norm2)\.(weight|bias)", r"blocks.\1.norm2.\2"),
        (_LAYER + r"(?:intermediate\.dense|mlp\.fc1)\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
        (_LAYER + r"(?:output\.dense|mlp\.fc2)\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
        (_LAYER + r"layer_scale2\.lambda1", r"blocks.\1.ls2.gamma"),
        (r"layernorm\.(weight|bias)", r"norm.\1"),
        (r"(?:classifier|cls_classifier)\.(weight|bias)", r"head.\1"),
        (r"distillation_classifier\.(weight|bias)", r"head_dist.\1"),
    )
)
_QKV = re.compile(_PREFIX + _LAYER + r"attention\.attention\.(query|key|value)\.(weight|bias)$")
_DROP: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(_PREFIX + r"embeddings\.mask_token$"), "DINOv2's masked-pretraining token"),
    (re.compile(_PREFIX + r"pooler\.dense\.(weight|bias)$"), "ViTModel's tanh pooler"),
)
_MARK = re.compile(r"(^|\.)(encoder\.layer\.\d+\.|embeddings\.patch_embeddings\.)")


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return any(_MARK.search(k) for k in sd)


def _qkv_parts(sd: Mapping[str, torch.Tensor]) -> tuple[StateDict, dict[str, str]]:
    """Concatenate each layer's query, key, value (in that order) into ``qkv``;
    also returns ``qkv`` name -> the checkpoint's ``...{query,key,value}...``."""
    groups: dict[tuple[str, str], dict[str, tuple[str, torch.Tensor]]] = {}
    for k, v in sd.items():
        m = _QKV.match(k)
        if m:
            groups.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = (k, v)
    out: StateDict = {}
    source: dict[str, str] = {}
    for (layer, kind), parts in groups.items():
        lacking = [p for p in ("query", "key", "value") if p not in parts]
        if lacking:
            have = next(iter(parts.values()))[0]
            want = have.rsplit(".", 2)[0] + f".{lacking[0]}.{kind}"
            raise ConfigError(
                f"Hugging Face checkpoint lacks key {want!r} (layer {layer} has "
                f"{', '.join(sorted(parts))} only); the file is truncated or not a ViT"
            )
        name = f"blocks.{layer}.attn.qkv.{kind}"
        out[name] = torch.cat([parts[p][1] for p in ("query", "key", "value")], 0)
        source[name] = parts["query"][0].replace(".query.", ".{query,key,value}.")
    return out, source


def hf_to_osfl(sd: Mapping[str, torch.Tensor]) -> Converted:
    refuse_swiglu(sd)
    out, source = _qkv_parts(sd)  # source: our name -> the checkpoint's
    dropped: list[str] = []
    notes: list[str] = []
    for k, v in sd.items():
        if _QKV.match(k):
            continue
        why = next((why for pat, why in _DROP if pat.match(k)), None)
        if why is not None:
            dropped.append(k)
            notes.append(f"{k}: {why}, dropped")
            continue
        name = next((pat.sub(rep, k) for pat, rep in _RULES if pat.match(k)), k)
        out[name], source[name] = v, k
    cls, head = out.get("cls_token"), out.get("head.weight")
    if cls is not None and head is not None and head.shape[-1] == 2 * cls.shape[-1]:
        # Dinov2ForImageClassification: Linear(2·D) over [class token, mean patch token]
        for name in ("head.weight", "head.bias"):
            if out.pop(name, None) is not None:
                dropped.append(source[name])
        notes.append("classifier: DINOv2's reads [class, mean patch] tokens (2·D), dropped")
    return Converted(out, tuple(dropped), tuple(notes), source)


# --- export ----------------------------------------------------------------------
_VIT_NAMES = {"norm1": "layernorm_before", "norm2": "layernorm_after"}
_VIT_NAMES |= {"mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
_DINO_NAMES = {"norm1": "norm1", "norm2": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_DINO_NAMES |= {"ls1.gamma": "layer_scale1.lambda1", "ls2.gamma": "layer_scale2.lambda1"}
_TOP = {
    "cls_token": "embeddings.cls_token",
    "reg_token": "embeddings.register_tokens",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)$|blocks\.(\d+)\.(ls[12]\.gamma)$")


def osfl_to_hf(sd: Mapping[str, torch.Tensor]) -> StateDict:
    """A ViT as ``ViTForImageClassification`` (``vit.`` prefix, ``classifier``),
    or, when it has layer scale or registers, as ``Dinov2Model`` /
    ``Dinov2WithRegistersModel`` (no prefix, no classifier, zero ``mask_token``)."""
    dino = "reg_token" in sd or any(k.endswith("ls1.gamma") for k in sd)
    names, prefix = (_DINO_NAMES, "") if dino else (_VIT_NAMES, "vit.")
    out: StateDict = {}
    for k, v in sd.items():
        if k in _TOP:
            out[prefix + _TOP[k]] = v
            continue
        if k.startswith("head."):
            if not dino:
                out["classifier." + k[len("head.") :]] = v
            continue
        m = _BLOCK.match(k)
        renamed = _hf_block(m, v, names, prefix) if m else None
        if renamed is None:
            raise ConfigError(f"key {k!r} has no Hugging Face {'DINOv2' if dino else 'ViT'} name")
        out.update(renamed)
    if dino:
        out["embeddings.mask_token"] = zero_mask_token(sd)
    return out


def _hf_block(
    m: re.Match[str], v: torch.Tensor, names: Mapping[str, str], prefix: str
) -> StateDict | None:
    """The Hugging Face name(s) of one block tensor (``m``: its
    :data:`_BLOCK` match), or ``None`` when it has none: a fused ``qkv`` is
    split back into Hugging Face's separate query, key and value."""
    layer = f"{prefix}encoder.layer."
    if m.group(4) is not None:  # layer scale
        sub = m.group(5)
        return {f"{layer}{m.group(4)}.{names[sub]}": v} if sub in names else None
    block, part, kind = m.group(1), m.group(2), m[3]
    if part == "attn.qkv":
        qkv = zip(("query", "key", "value"), v.chunk(3, dim=0), strict=True)
        return {f"{layer}{block}.attention.attention.{q}.{kind}": t for q, t in qkv}
    if part == "attn.proj":
        return {f"{layer}{block}.attention.output.dense.{kind}": v}
    if part in names:
        return {f"{layer}{block}.{names[part]}.{kind}": v}
    return None


HUGGINGFACE = register_layout(
    Layout(
        name="huggingface",
        summary="Hugging Face transformers ViT / DeiT / DINOv2 (vit.encoder.layer.{i}..., "
        "embeddings.position_embeddings, ...)",
        detect=detect,
        to_osfl=hf_to_osfl,
        from_osfl=osfl_to_hf,
    )
)
