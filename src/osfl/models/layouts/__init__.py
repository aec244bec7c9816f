"""Published checkpoint key layouts (see :mod:`osfl.models.layouts.base`).

Importing this package registers every layout: ``timm`` (also torchvision and
this project's own names; the default), ``dinov2`` (facebookresearch/dinov2
originals) and ``huggingface`` (``transformers`` ViT / DeiT / DINOv2).
"""

from osfl.models.layouts import dinov2, huggingface, timm  # noqa: F401  (registers them)
from osfl.models.layouts.base import (
    DEFAULT_LAYOUT,
    LAYOUTS,
    Converted,
    Layout,
    detect_layout,
    export_state_dict,
    register_layout,
)

__all__ = [
    "DEFAULT_LAYOUT",
    "LAYOUTS",
    "Converted",
    "Layout",
    "detect_layout",
    "export_state_dict",
    "register_layout",
]
