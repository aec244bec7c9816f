"""The checkpoint-layout registry: how a published checkpoint names its tensors.

A :class:`Layout` renames a foreign state dict to this project's names (which
are timm's, ``timm/models/vision_transformer.py``, and torchvision's for the
ResNets) and back. :func:`osfl.models.load_pretrained` detects the layout from
the keys (or is told it), converts, then fits shapes. Keeping each published
layout in its own module, registered by name, is what lets a new one be added
without touching the loader (registries, not ``if/elif`` on strings).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.registry import Registry

StateDict = dict[str, torch.Tensor]

#: The layout a checkpoint is taken to have when no other layout claims it.
DEFAULT_LAYOUT = "timm"

_SWIGLU = re.compile(r"(^|\.)mlp\.(w12|w3|weights_in|weights_out)\.(weight|bias)$")


@dataclass(frozen=True)
class Converted:
    """A state dict in this project's names, the source keys deliberately not
    loaded (``dropped``), human-readable notes on what was changed, and
    ``renamed``: this project's name -> the checkpoint's, so that an error can
    name the key the user will find in the file."""

    state_dict: StateDict
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    renamed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """One published key layout.

    ``detect`` says whether a state dict is in this layout (the default layout's
    is never asked); ``to_osfl`` renames to this project's names; ``from_osfl``
    renames back (export, e.g. to hand weights to ``transformers``)."""

    name: str
    summary: str
    detect: Callable[[Mapping[str, torch.Tensor]], bool]
    to_osfl: Callable[[Mapping[str, torch.Tensor]], Converted]
    from_osfl: Callable[[Mapping[str, torch.Tensor]], StateDict]


LAYOUTS: Registry[Layout] = Registry("checkpoint layout")


def register_layout(layout: Layout) -> Layout:
    LAYOUTS.add(layout.name, layout)
    return layout


def detect_layout(sd: Mapping[str, torch.Tensor]) -> Layout:
    """The one non-default layout whose ``detect`` claims ``sd``, else the default."""
    hits = [LAYOUTS.get(n) for n in LAYOUTS if n != DEFAULT_LAYOUT and LAYOUTS.get(n).detect(sd)]
    if len(hits) > 1:
        names = ", ".join(h.name for h in hits)
        raise ConfigError(f"checkpoint matches several layouts ({names}); pass layout=NAME")
    return hits[0] if hits else LAYOUTS.get(DEFAULT_LAYOUT)


def export_state_dict(model: nn.Module | Mapping[str, torch.Tensor], layout: str) -> StateDict:
    """``model``'s weights (or a state dict in this project's names) renamed to
    ``layout``: a file that the layout's own library loads, e.g.
    ``transformers``' ``Dinov2Model`` for ``"huggingface"``. Tensors are
    contiguous copies, ready for ``safetensors.torch.save_file``."""
    sd = model.state_dict() if isinstance(model, nn.Module) else dict(model)
    out = LAYOUTS.get(layout).from_osfl(sd)
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def refuse_swiglu(sd: Mapping[str, torch.Tensor]) -> None:
    """DINOv2-giant's SwiGLU MLP has no counterpart in this project's ViT."""
    key = next((k for k in sd if _SWIGLU.search(k)), None)
    if key is not None:
        raise ConfigError(
            f"checkpoint key {key!r} belongs to a SwiGLU MLP (DINOv2 ViT-g/14), which osfl's "
            "ViT does not implement; use a ViT-S/B/L checkpoint (dinov2_small/base/large)"
        )


def zero_mask_token(sd: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The (1, D) ``mask_token`` DINOv2 checkpoints carry (only its masked-image
    pretraining uses it), for exports that must have every key of the original."""
    return sd["cls_token"].new_zeros(1, sd["cls_token"].shape[-1])
