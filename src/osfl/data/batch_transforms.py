"""The batched geometric and normalising transforms: every op works on a
whole B×C×H×W float batch, with one random draw per sample from the
``torch.Generator`` passed in (semantics of torchvision's ``transforms.v2``;
RandomResizedCrop: Szegedy et al., 2015; pad-and-crop + flip: the CIFAR recipe
of He et al., 2016). :mod:`osfl.data.transforms` names the pipelines built
from them; colour jitter is in :mod:`osfl.data.colour`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from osfl.data.device_path import _const, _rand
from osfl.errors import ConfigError, DataError

#: torchvision's grayscale weights (ITU-R 601-2 luma).
_GRAY = (0.2989, 0.587, 0.114)


def _check_batch(x: torch.Tensor, who: str) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise DataError(
            f"{who} expects a B×C×H×W tensor, got shape {tuple(getattr(x, 'shape', ()))}"
        )
    if not x.is_floating_point():
        raise DataError(f"{who} expects a float batch (put ToFloat first), got {x.dtype}")


def _pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if len(hw) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in hw):
        raise ConfigError(f"{name} must be a positive int or (height, width), got {size!r}")
    return int(hw[0]), int(hw[1])


def _prob(p: float, name: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {p!r}")
    return float(p)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """B×3×H×W -> B×1×H×W luma."""
    return (x * _const(_GRAY, x.dtype, x.device)).sum(1, keepdim=True)


class Transform:
    """A batched transform: ``t(x, generator) -> x'`` on x's device."""

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"

    def key(self) -> Any:
        """A JSON-able identity for cache keys: equal pipelines give equal keys
        (the class and its parameters; memory addresses stripped)."""
        text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(self))
        return f"{type(self).__module__}.{type(self).__qualname__}:{text}"


class Compose(Transform):
    """Apply transforms in order, passing the same generator along."""

    def __init__(self, transforms: Sequence[Transform]):
        self.transforms = list(transforms)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        for t in self.transforms:
            x = t(x, generator)
        return x


class ToFloat(Transform):
    """uint8 -> float32 in [0, 1] (divide by 255); float input passes through."""

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if x.dtype == torch.uint8:
            return x.float().div_(255.0)
        if not x.is_floating_point():
            raise DataError(f"ToFloat expects uint8 or float images, got {x.dtype}")
        return x


class Resize(Transform):
    """Resize to ``size`` (antialiased bilinear); a no-op when already that size."""

    def __init__(self, size: int | Sequence[int]):
        self.size = _pair(size, "Resize size")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "Resize")
        if tuple(x.shape[-2:]) == self.size:
            return x
        return F.interpolate(
            x, size=self.size, mode="bilinear", antialias=True, align_corners=False
        )


class RandomResizedCrop(Transform):
    """torchvision's RandomResizedCrop, one box per sample, one ``grid_sample``.

    Per sample: up to 10 tries of area fraction ~ U(scale) and log aspect ratio
    ~ U(log ratio), the first box that fits wins, else the central box with the
    ratio clamped; offsets are uniform integers. The boxes are then resampled
    bilinearly to ``size`` in a single batched ``affine_grid``/``grid_sample``
    (no antialiasing: strong downscaling aliases, unlike torchvision's).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ):
        self.size = _pair(size, "RandomResizedCrop size")
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ConfigError(
                f"RandomResizedCrop scale must satisfy 0 < lo <= hi <= 1, got {scale}"
            )
        if not (0 < ratio[0] <= ratio[1]):
            raise ConfigError(f"RandomResizedCrop ratio must satisfy 0 < lo <= hi, got {ratio}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))

    def boxes(
        self, b: int, h: int, w: int, generator: torch.Generator | None, device: torch.device
    ) -> torch.Tensor:
        """B×4 integer boxes (top, left, height, width), the torchvision draw."""
        tries = 10
        u = _rand((b, tries, 4), generator, device).double()
        area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0])
        lr = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        ar = torch.exp(lr[0] + (lr[1] - lr[0]) * u[..., 1])
        cw = torch.sqrt(area * ar).round()
        ch = torch.sqrt(area / ar).round()
        ok = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
        first = torch.where(ok.any(1), ok.double().argmax(1), torch.full((b,), -1, device=device))
        # fallback: central crop with the ratio clamped to the allowed range
        in_ratio = w / h
        if in_ratio < self.ratio[0]:
            fw, fh = w, round(w / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            fw, fh = round(h * self.ratio[1]), h
        else:
            fw, fh = w, h
        pick = first.clamp(min=0).view(b, 1)
        bw = torch.where(
            first >= 0, cw.gather(1, pick).squeeze(1), torch.full_like(first, fw, dtype=cw.dtype)
        )
        bh = torch.where(
            first >= 0, ch.gather(1, pick).squeeze(1), torch.full_like(first, fh, dtype=ch.dtype)
        )
        ui = u[..., 2].gather(1, pick).squeeze(1)
        uj = u[..., 3].gather(1, pick).squeeze(1)
        top = torch.where(first >= 0, (ui * (h - bh + 1)).floor(), ((h - bh) / 2).round())
        left = torch.where(first >= 0, (uj * (w - bw + 1)).floor(), ((w - bw) / 2).round())
        return torch.stack([top, left, bh, bw], 1).long()

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "RandomResizedCrop")
        b, c, h, w = x.shape
        top, left, bh, bw = self.boxes(b, h, w, generator, x.device).to(x.dtype).unbind(1)
        # affine map from output [-1, 1] coords to the box (align_corners=False pixel centres)
        theta = torch.zeros(b, 2, 3, dtype=x.dtype, device=x.device)
        theta[:, 0, 0] = bw / w
        theta[:, 0, 2] = (2 * left + bw) / w - 1
        theta[:, 1, 1] = bh / h
        theta[:, 1, 2] = (2 * top + bh) / h - 1
        grid = F.affine_grid(theta, [b, c, *self.size], align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class RandomCrop(Transform):
    """Pad by ``padding`` then crop ``size`` at a per-sample random offset.

    One batched ``gather`` of each sample's crop from its flattened padded
    image: no loop over samples, and no intermediate (2.6× the two-gather
    rows-then-columns version, the same pixels). With padding 0 and size =
    the image size it is the identity.
    """

    def __init__(self, size: int | Sequence[int], padding: int = 0, padding_mode: str = "constant"):
        self.size = _pair(size, "RandomCrop size")
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ConfigError(f"RandomCrop padding must be a non-negative int, got {padding!r}")
        if padding_mode not in ("constant", "reflect", "replicate"):
            raise ConfigError(
                f"padding_mode must be constant, reflect or replicate, got {padding_mode!r}"
            )
        self.padding = padding
        self.padding_mode = padding_mode

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "RandomCrop")
        p = self.padding
        if p:
            x = F.pad(x, (p, p, p, p), mode=self.padding_mode)
        b, c, h, w = x.shape
        th, tw = self.size
        if th > h or tw > w:
            raise DataError(f"RandomCrop size {self.size} exceeds the padded image {h}×{w}")
        u = _rand((b, 2), generator, x.device)
        top = (u[:, 0] * (h - th + 1)).long().clamp_(max=h - th)
        left = (u[:, 1] * (w - tw + 1)).long().clamp_(max=w - tw)
        rows = top[:, None, None] + torch.arange(th, device=x.device).view(1, th, 1)
        cols = left[:, None, None] + torch.arange(tw, device=x.device).view(1, 1, tw)
        flat = (rows * w + cols).view(b, 1, th * tw).expand(b, c, th * tw)
        return torch.gather(x.flatten(2), 2, flat).view(b, c, th, tw)


class RandomHorizontalFlip(Transform):
    """Mirror each sample left-right with probability ``p`` (p=0: never, p=1: always)."""

    def __init__(self, p: float = 0.5):
        self.p = _prob(p, "RandomHorizontalFlip p")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "RandomHorizontalFlip")
        flip = _rand((x.shape[0],), generator, x.device) < self.p
        # one gather with each sample's column order: a single pass over the
        # batch (where(flip, x.flip(-1), x) makes two and a full copy)
        b, c, h, w = x.shape
        ahead = torch.arange(w, device=x.device)
        cols = torch.where(flip[:, None], ahead.flip(0), ahead)
        return torch.gather(x, 3, cols.view(b, 1, 1, w).expand(b, c, h, w))


class RandomApply(Transform):
    """Apply ``transform`` to each sample with probability ``p`` (others unchanged)."""

    def __init__(self, transform: Transform, p: float = 0.5):
        self.transform = transform
        self.p = _prob(p, "RandomApply p")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        keep = _rand((x.shape[0],), generator, x.device) < self.p
        y = self.transform(x, generator)
        if y.shape != x.shape:
            raise DataError("RandomApply needs a shape-preserving transform")
        return torch.where(keep.view(-1, 1, 1, 1), y, x)


class RandomGrayscale(Transform):
    """Turn each sample grey (luma replicated to 3 channels) with probability ``p``.

    Single-channel input is already grey and is returned unchanged.
    """

    def __init__(self, p: float = 0.1):
        self.p = _prob(p, "RandomGrayscale p")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "RandomGrayscale")
        mask = _rand((x.shape[0],), generator, x.device) < self.p
        if x.shape[1] == 1:
            return x
        if x.shape[1] != 3:
            raise DataError(f"RandomGrayscale needs 1 or 3 channels, got {x.shape[1]}")
        return torch.where(mask.view(-1, 1, 1, 1), grayscale(x).expand_as(x), x)


class Normalize(Transform):
    """(x - mean) / std per channel; :meth:`inverse` undoes it (for plots, inversion)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or not self.mean:
            raise ConfigError(
                f"Normalize mean {self.mean} and std {self.std} must have equal, non-zero length"
            )
        if any(not s > 0 for s in self.std):
            raise ConfigError(f"Normalize std must be > 0, got {self.std}")

    def _stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch(x, "Normalize")
        if x.shape[1] != len(self.mean):
            raise DataError(
                f"Normalize has {len(self.mean)} channel stats but the batch has {x.shape[1]} channels"
            )
        # cached per device and dtype: a fresh torch.tensor on a GPU is a
        # blocking copy per batch
        return _const(self.mean, x.dtype, x.device), _const(self.std, x.dtype, x.device)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        m, s = self._stats(x)
        return (x - m) / s

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        m, s = self._stats(x)
        return x * s + m
