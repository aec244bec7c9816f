"""The model registry: ``create_model(name, num_classes=..., **kw)``.

Follows timm's ``_registry.py`` / ``_factory.py``: a model family registers
tiny constructors (just hyper-parameters) with :func:`register_model`, and
:func:`create_model` builds one by name, so configs and the CLI name models
by string. Unknown names and keyword arguments are :class:`~osfl.errors.ConfigError`.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from typing import Any, TypeVar, overload

from torch import nn

from osfl.errors import ConfigError
from osfl.models.layers import check_positive
from osfl.models.weights import load_pretrained
from osfl.registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")

F = TypeVar("F", bound=Callable[..., nn.Module])


@overload
def register_model(fn: F) -> F: ...
@overload
def register_model(fn: str) -> Callable[[F], F]: ...
def register_model(fn: F | str) -> F | Callable[[F], F]:
    """Register a model constructor under its function name (``@register_model``)
    or an explicit name (``@register_model("name")``). Duplicates raise."""
    if isinstance(fn, str):
        return MODELS.register(fn)
    MODELS.add(fn.__name__, fn)
    return fn


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted; ``pattern`` is a shell glob (``"vit_*"``)."""
    names = MODELS.names()
    return names if pattern is None else [n for n in names if fnmatch.fnmatch(n, pattern.lower())]


def create_model(
    name: str,
    *,
    num_classes: int | None = None,
    pretrained: str | os.PathLike[str] | None = None,
    pretrained_head: str = "auto",
    **kwargs: Any,
) -> nn.Module:
    """Build a registered model.

    ``num_classes`` defaults to the constructor's own default (1000 for the
    ImageNet-sized ViT/DeiT, 10 for the CIFAR/digit CNNs); other keyword
    arguments (``in_chans``, ``img_size``, ``act``, ``depth``, ...) go to the
    constructor. ``pretrained`` is a local checkpoint path, or an explicit
    ``hf-hub:owner/name`` id (the only case that downloads), loaded with
    :func:`osfl.models.weights.load_pretrained` (layout detected from the keys,
    position embeddings resampled to ``img_size``, head dropped when the class
    count differs); see docs/models.md. ``pretrained_head``: ``auto`` loads
    the checkpoint's head when its class count matches, ``fresh`` never does
    (the run's classes are not the checkpoint's upstream ones; the assembly
    layer sets it for an ``osfl pretrain`` encoder).
    """
    if pretrained_head not in ("auto", "fresh"):
        raise ConfigError(f"pretrained_head must be 'auto' or 'fresh', got {pretrained_head!r}")
    fn = MODELS.get(name)
    if num_classes is not None:
        kwargs["num_classes"] = check_positive("num_classes", num_classes)
    try:
        model = fn(**kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise ConfigError(f"model {name!r}: {e}") from e
        raise
    if pretrained is not None:
        load_pretrained(model, pretrained, fresh_head=pretrained_head == "fresh")
    return model
