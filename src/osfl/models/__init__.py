"""Model registry and model families (docs/design.md §3 ``models/``).

``create_model(name, num_classes=..., **kw)`` builds any registered model;
``list_models()`` names them. Every model follows
:class:`~osfl.models.layers.ImageClassifier` (``forward_features`` -> (B, D),
``forward_head``, ``num_features``, ``get_classifier``, ``feature_extractor``);
ViT/DeiT add sparse-token forward, attention maps, block split and token
logits (:mod:`osfl.models.vit`). Importing this package registers every family.

Pretrained weights: ``load_pretrained(model, path_or_hub_id)`` reads timm /
torchvision / facebookresearch-DINOv2 / Hugging Face checkpoints
(:mod:`osfl.models.layouts`), ``export_state_dict(model, layout)`` writes them
back in any of those layouts (docs/models.md).
"""

from osfl.models import cnn, lenet, resnet, vgg, vit  # noqa: F401  (registers the families)
from osfl.models.layers import ACTIVATIONS, ImageClassifier, get_act_layer
from osfl.models.layouts import LAYOUTS, export_state_dict
from osfl.models.registry import MODELS, create_model, list_models, register_model
from osfl.models.vit import VisionTransformer, random_keep_idx
from osfl.models.weights import LoadReport, load_pretrained

__all__ = [
    "ACTIVATIONS",
    "LAYOUTS",
    "MODELS",
    "ImageClassifier",
    "LoadReport",
    "VisionTransformer",
    "create_model",
    "export_state_dict",
    "get_act_layer",
    "list_models",
    "load_pretrained",
    "random_keep_idx",
    "register_model",
]
