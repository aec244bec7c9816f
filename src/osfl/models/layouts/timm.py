"""timm / DeiT / torchvision names: this project's own, loaded as they are.

Covers timm's ViT/DeiT (``timm/models/vision_transformer.py``), timm's DINOv2
(``vit_*_patch14_dinov2``, ``vit_*_patch14_reg4_dinov2``), torchvision's and
timm's ResNets (``torchvision/models/resnet.py``: ``conv1``, ``bn1``,
``layer{1-4}.{j}.conv1/bn1/conv2/bn2(/conv3/bn3)/downsample.0/1``, ``fc``), and
any state dict this project saved.

One conversion: timm builds its register variants with ``no_embed_class=True``
(``_convert_dinov2`` folds the class position into ``cls_token`` and keeps a
(1, N, D) ``pos_embed``), whereas this project's ``pos_embed`` always has the
class position first. Loading prepends a zero class position (exact: the sum
``cls_token + pos_embed[:, 0]`` is unchanged); export folds it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from osfl.models.layouts.base import Converted, Layout, StateDict, refuse_swiglu, register_layout


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def timm_to_osfl(sd: Mapping[str, torch.Tensor]) -> Converted:
    refuse_swiglu(sd)
    out = dict(sd)
    pos = out.get("pos_embed")
    notes: tuple[str, ...] = ()
    if pos is not None and pos.ndim == 3 and "cls_token" in out and _is_square(pos.shape[1]):
        out["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
        notes = ("pos_embed: timm no_embed_class layout, zero class position prepended",)
    return Converted(out, notes=notes)


def osfl_to_timm(sd: Mapping[str, torch.Tensor]) -> StateDict:
    out = dict(sd)
    if "reg_token" in out:  # timm's *_reg4_dinov2 models: no_embed_class=True
        pos = out["pos_embed"]
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    return out


TIMM = register_layout(
    Layout(
        name="timm",
        summary="timm / DeiT / torchvision / osfl names (cls_token, blocks.{i}.attn.qkv, "
        "layer1.0.conv1, ...)",
        detect=lambda sd: True,
        to_osfl=timm_to_osfl,
        from_osfl=osfl_to_timm,
    )
)
