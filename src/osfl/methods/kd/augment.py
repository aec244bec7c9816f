"""Augmentations of synthetic images at distillation (and synthesis) time:
float batches in model-input space, per-sample draws.

DENSE and Co-Boosting distil on ``RandomCrop(32, padding=4)`` + flip of the
pool images (their ``kd_train``); FedMITR cannot (its kept-patch masks index
the un-augmented images), hence ``none``.
"""

from __future__ import annotations

from collections.abc import Callable

from osfl.data.transforms import Compose, RandomCrop, RandomHorizontalFlip, Transform
from osfl.registry import Registry

__all__ = ["AUGMENTS", "build_augment"]

#: name -> ``factory(image_size) -> Transform | None``
AUGMENTS: Registry[Callable[[int], Transform | None]] = Registry("kd augmentation")
AUGMENTS.add("none", lambda size: None)
AUGMENTS.add("flip", lambda size: RandomHorizontalFlip())
AUGMENTS.add(
    "crop_flip",
    lambda size: Compose([RandomCrop(size, padding=max(1, size // 8)), RandomHorizontalFlip()]),
)


def build_augment(name: str, image_size: int) -> Transform | None:
    return AUGMENTS.get(name)(image_size)
