"""Batched image transforms on the batch's device, with per-sample random draws.

Semantics follow torchvision's ``transforms.v2`` (RandomResizedCrop: Szegedy
et al., 2015; colour jitter and random grayscale as in SimCLR, Chen et al.,
2020; pad-and-crop + flip: the CIFAR recipe of He et al., 2016), but each op
works on a whole B×C×H×W float batch at once: every sample gets its own crop
box, flip coin and jitter factors, drawn from the ``torch.Generator`` passed
in, and the work is a handful of tensor ops, not a Python loop over samples
(docs/design.md §7). Random numbers are drawn on the generator's device and moved
to the batch's, so a CPU generator drives a CUDA batch reproducibly.

**Two paths, one per device (issue #40).** On the CPU every op runs as it
always has (the same random stream, the same kernels: documented numbers stay
bit for bit). Off the CPU (:func:`device_path`) nothing in a pipeline makes
the host wait for the GPU: the caller draws from a generator *on the batch's
device* (:func:`augmentation_generator`, seeded from the run's CPU generator,
so a seed still fixes every view), constants (Normalize's mean and std, the
luma weights) are made once per device and dtype, and :class:`ColorJitter`
selects its samples with ``torch.where`` instead of ``nonzero()`` (each a
device-to-host copy of a count). A GPU run therefore draws other
augmentations than a CPU run of the same seed; :func:`emulate_device_path`
runs the device path on the CPU, so that tests can compare a simulated GPU
with the CPU bit for bit.

A pipeline starts with :class:`ToFloat` (uint8 -> float in [0, 1]) and ends
with :class:`Normalize`; :func:`build_transform` gives the named pipelines
configs refer to ("none", "crop_flip", "simclr").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from osfl.data.batch_transforms import (
    Compose,
    Normalize,
    RandomApply,
    RandomCrop,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToFloat,
    Transform,
    grayscale,
)
from osfl.data.colour import (
    ColorJitter,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    hsv_to_rgb,
    rgb_to_hsv,
)
from osfl.data.device_path import augmentation_generator, device_path, emulate_device_path
from osfl.errors import ConfigError, DataError
from osfl.registry import Registry

__all__ = [
    "PIPELINES",
    "ColorJitter",
    "Compose",
    "Normalize",
    "PipelineBuilder",
    "RandomApply",
    "RandomCrop",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToFloat",
    "Transform",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "augmentation_generator",
    "build_transform",
    "channel_stats",
    "default_transforms",
    "device_path",
    "emulate_device_path",
    "grayscale",
    "hsv_to_rgb",
    "rgb_to_hsv",
    "simclr_pipeline",
]


def channel_stats(images: object, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of an ImageSet (or N×C×H×W tensor), in [0, 1] units.

    For uint8 images the sums are exact integers (int64), so every process
    computes the very same statistics whatever its thread count: they enter
    the normalisation, hence every party's job digest, and a float sum split
    across threads differs in its last bits. Other dtypes are summed in
    float64 (bounded memory on 50,000 images either way).
    """
    x = getattr(images, "images", images)
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or x.shape[0] == 0:
        raise DataError("channel_stats needs a non-empty ImageSet or N×C×H×W tensor")
    c = x.shape[1]
    exact = x.dtype == torch.uint8
    acc = torch.int64 if exact else torch.float64
    s = torch.zeros(c, dtype=acc)
    s2 = torch.zeros(c, dtype=acc)
    for i in range(0, x.shape[0], chunk):
        v = x[i : i + chunk].to("cpu", acc).transpose(0, 1).reshape(c, -1)
        s += v.sum(1)
        s2 += (v * v).sum(1)
    n = x.shape[0] * x.shape[2] * x.shape[3]
    scale = 255.0 if exact else 1.0
    mean = s.double() / n / scale
    std = (s2.double() / n / scale**2 - mean * mean).clamp(min=0).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


PipelineBuilder = Callable[..., Transform]
#: name -> builder(image_size, mean, std) -> Transform
PIPELINES: Registry[PipelineBuilder] = Registry("transform pipeline")


def _resize(image_size: int | None) -> list[Transform]:
    return [] if image_size is None else [Resize(image_size)]


@PIPELINES.register("none")
def _none(image_size: int | None, mean: Sequence[float], std: Sequence[float]) -> Transform:
    """Evaluation: to float, resize if asked, normalise."""
    return Compose([ToFloat(), *_resize(image_size), Normalize(mean, std)])


@PIPELINES.register("flip")
def _flip(image_size: int | None, mean: Sequence[float], std: Sequence[float]) -> Transform:
    """Horizontal flips only (for images too small to crop, e.g. 8×8 digits)."""
    return Compose([ToFloat(), *_resize(image_size), RandomHorizontalFlip(), Normalize(mean, std)])


@PIPELINES.register("crop_flip")
def _crop_flip(image_size: int | None, mean: Sequence[float], std: Sequence[float]) -> Transform:
    """The CIFAR standard (He et al., 2016): pad 4, random crop, flip."""
    if image_size is None:
        raise ConfigError("the 'crop_flip' pipeline needs image_size")
    return Compose(
        [
            ToFloat(),
            Resize(image_size),
            RandomCrop(image_size, padding=4),
            RandomHorizontalFlip(),
            Normalize(mean, std),
        ]
    )


@PIPELINES.register("simclr")
def _simclr(image_size: int | None, mean: Sequence[float], std: Sequence[float]) -> Transform:
    """SimCLR's views (Chen et al., 2020): resized crop of area (0.08, 1), flip,
    jitter 0.4/0.4/0.4/0.1 with p=0.8, grayscale p=0.2."""
    return simclr_pipeline(image_size, mean, std)


def simclr_pipeline(
    image_size: int | None,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    crop_scale: tuple[float, float] = (0.08, 1.0),
) -> Transform:
    """The ``simclr`` views with the resized crop's area range ``crop_scale``:
    (0.08, 1) is SimCLR's; (0.2, 1) is SupCon's and FAFI's public code's."""
    if image_size is None:
        raise ConfigError("the 'simclr' pipeline needs image_size")
    return Compose(
        [
            ToFloat(),
            RandomResizedCrop(image_size, scale=crop_scale),
            RandomHorizontalFlip(),
            RandomApply(ColorJitter(0.4, 0.4, 0.4, 0.1), p=0.8),
            RandomGrayscale(0.2),
            Normalize(mean, std),
        ]
    )


def build_transform(
    name: str, *, image_size: int | None, mean: Sequence[float], std: Sequence[float]
) -> Transform:
    """The named pipeline (``PIPELINES``: none, flip, crop_flip, simclr) for these stats."""
    return PIPELINES.get(name)(image_size, mean, std)


def default_transforms(
    train: object, *, augment: str = "crop_flip", image_size: int | None = None
) -> tuple[Transform, Transform]:
    """(train, eval) pipelines for an ImageSet: ``augment`` for training, "none" for
    evaluation, both normalised with the train set's channel statistics."""
    mean, std = channel_stats(train)
    if image_size is None:
        image_size = int(getattr(train, "images", train).shape[-1])
    return (
        build_transform(augment, image_size=image_size, mean=mean, std=std),
        build_transform("none", image_size=image_size, mean=mean, std=std),
    )
