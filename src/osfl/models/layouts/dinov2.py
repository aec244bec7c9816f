"""facebookresearch/dinov2's own checkpoints (``dinov2_vits14_pretrain.pth``,
``dinov2_vits14_reg4_pretrain.pth``, torch.hub ``dinov2_vits14`` state dicts).

Names follow ``dinov2/models/vision_transformer.py``: the same as timm's
(``blocks.{i}.norm1/attn.qkv/attn.proj/ls1.gamma/norm2/mlp.fc1/mlp.fc2/ls2.gamma``,
``norm``) plus ``mask_token`` (1, D) (used only by iBOT's masked-image loss,
so dropped, as timm's ``_convert_dinov2`` does) and ``register_tokens``
(1, R, D), which become ``reg_token``. ``pos_embed`` keeps the class position
first and registers get none, exactly this project's convention.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from osfl.models.layouts.base import (
    Converted,
    Layout,
    StateDict,
    refuse_swiglu,
    register_layout,
    zero_mask_token,
)


def detect(sd: Mapping[str, torch.Tensor]) -> bool:
    return "cls_token" in sd and ("mask_token" in sd or "register_tokens" in sd)


def dinov2_to_osfl(sd: Mapping[str, torch.Tensor]) -> Converted:
    refuse_swiglu(sd)
    out = {k: v for k, v in sd.items() if k not in ("mask_token", "register_tokens")}
    dropped, notes = [], []
    if "mask_token" in sd:
        dropped.append("mask_token")
        notes.append("mask_token: DINOv2's masked-pretraining token dropped")
    renamed = {}
    if "register_tokens" in sd:
        out["reg_token"], renamed["reg_token"] = sd["register_tokens"], "register_tokens"
    return Converted(out, tuple(dropped), tuple(notes), renamed)


def osfl_to_dinov2(sd: Mapping[str, torch.Tensor]) -> StateDict:
    """The backbone as DINOv2's ``DinoVisionTransformer`` names it (it has no
    classifier, so ``head.*`` is left out)."""
    out = {k: v for k, v in sd.items() if not k.startswith("head.") and k != "reg_token"}
    out["mask_token"] = zero_mask_token(sd)
    if "reg_token" in sd:
        out["register_tokens"] = sd["reg_token"]
    return out


DINOV2 = register_layout(
    Layout(
        name="dinov2",
        summary="facebookresearch/dinov2 originals (timm names + mask_token, register_tokens)",
        detect=detect,
        to_osfl=dinov2_to_osfl,
        from_osfl=osfl_to_dinov2,
    )
)
