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

import hashlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

from osfl.errors import ConfigError, DataError
from osfl.registry import Registry

#: torchvision's grayscale weights (ITU-R 601-2 luma).
_GRAY = (0.2989, 0.587, 0.114)
#: the offsets n of R, G, B in the branch-free HSV -> RGB formula
_HSV_N = (5.0, 3.0, 1.0)


#: Set inside :func:`emulate_device_path`: the CPU takes the device path too.
_EMULATE: ContextVar[bool] = ContextVar("osfl_emulate_device_path", default=False)


def device_path(device: torch.device | str) -> bool:
    """Whether work on ``device`` takes the sync-free device path (module
    docstring): off the CPU always; on the CPU only inside
    :func:`emulate_device_path`, so that CPU numbers never change."""
    return torch.device(device).type != "cpu" or _EMULATE.get()


@contextmanager
def emulate_device_path() -> Iterator[None]:
    """Run the device path on the CPU inside the block (a separate, seeded
    augmentation generator, ``torch.where`` selections): what a GPU run
    computes, on the CPU's kernels. For tests that compare a simulated device
    with the CPU bit for bit; a real run never needs it."""
    token = _EMULATE.set(True)
    try:
        yield
    finally:
        _EMULATE.reset(token)


def augmentation_generator(
    generator: torch.Generator | None, device: torch.device | str
) -> torch.Generator | None:
    """The generator a batch on ``device`` should draw its augmentations from.

    On the CPU path: ``generator`` itself (today's stream, interleaved with the
    loader's permutations: bit-identical numbers). On the device path: a new
    generator on ``device`` seeded from a hash of ``generator``'s state, which
    is read, not advanced (so the first epoch's batches are the CPU path's;
    later epochs differ, as the CPU path's augmentations advanced the shared
    generator between them); drawing there needs no host-to-device copy per
    batch, which would wait for the GPU. A generator already off the CPU is
    used as it is.
    """
    device = torch.device(device)
    if generator is None or not device_path(device) or generator.device.type != "cpu":
        return generator
    state = generator.get_state()
    digest = hashlib.blake2b(bytes(state.numpy()), digest_size=8, person=b"osfl-aug").digest()
    seed = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    return torch.Generator(device=device).manual_seed(seed)


#: Constant tensors per (values, dtype, device): made (copied to a GPU) once,
#: not per batch, because a blocking host-to-device copy waits for the GPU.
_CONSTS: dict[tuple[tuple[float, ...], torch.dtype, torch.device], torch.Tensor] = {}


def _const(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values)`` as a 1×C×1×1 tensor, cached per dtype and device
    (the same values as a fresh one: CPU numbers do not change). Made outside
    any ``inference_mode``, so that a later step with autograd may save it."""
    key = (values, dtype, device)
    t = _CONSTS.get(key)
    if t is None:
        with torch.inference_mode(False):
            t = torch.tensor(values, dtype=dtype, device=device).view(1, -1, 1, 1)
        _CONSTS[key] = t
    return t


def _rand(
    shape: Sequence[int], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """U[0, 1) on the generator's device, moved to ``device``."""
    gdev = generator.device if generator is not None else device
    return torch.rand(tuple(shape), generator=generator, device=gdev).to(device)


def _uniform(
    lo: float, hi: float, n: int, gen: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    return lo + (hi - lo) * _rand((n,), gen, device)


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


# --------------------------------------------------------------------------- colour


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """B×3×H×W RGB in [0, 1] -> HSV with hue in [0, 1) (torchvision's formula)."""
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    crd = torch.where(eqc, ones, cr)
    rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = torch.fmod((hr + hg + hb) / 6.0 + 1.0, 1.0)
    return torch.stack((h, s, maxc), 1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`, branch-free: c_n = V - V·S·clamp(min(k, 4-k), 0, 1),
    k = (n + 6H) mod 6 with n = 5, 3, 1 for R, G, B."""
    h, s, v = x.unbind(1)
    n = _const(_HSV_N, x.dtype, x.device)
    k = torch.remainder(n + 6.0 * h.unsqueeze(1), 6.0)
    w = torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)
    return v.unsqueeze(1) - (v * s).unsqueeze(1) * w


def _fac(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (x * _fac(f)).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Blend with the image's mean grey level (per sample)."""
    g = grayscale(x) if x.shape[1] == 3 else x
    mean = g.mean(dim=(1, 2, 3), keepdim=True)
    return (_fac(f) * x + (1 - _fac(f)) * mean).clamp_(0.0, 1.0)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Blend with the grey image; grey (1-channel) input is unchanged, as in torchvision."""
    if x.shape[1] == 1:
        return x
    return (_fac(f) * x + (1 - _fac(f)) * grayscale(x)).clamp_(0.0, 1.0)


def adjust_hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Rotate hue by ``f`` (fraction of a turn, in [-0.5, 0.5]); grey input unchanged.

    The same result as ``hsv_to_rgb`` of the shifted ``rgb_to_hsv``, in fewer
    passes: V·S is the chroma max - min, so S is never formed.
    """
    if x.shape[1] == 1:
        return x
    if x.shape[1] != 3:
        raise DataError(f"hue jitter needs RGB (3-channel) input, got {x.shape[1]} channels")
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    cr = maxc - minc
    crd = torch.where(cr == 0, torch.ones_like(cr), cr)
    is_r, is_g = maxc == r, (maxc == g) & (maxc != r)
    h6 = torch.where(
        is_r, (g - b) / crd, torch.where(is_g, 2.0 + (b - r) / crd, 4.0 + (r - g) / crd)
    )
    n = _const(_HSV_N, x.dtype, x.device)
    k = torch.remainder(n + (h6 + 6.0 * f.view(-1, 1, 1)).unsqueeze(1), 6.0)
    w = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return maxc.unsqueeze(1) - cr.unsqueeze(1) * w


class ColorJitter(Transform):
    """torchvision's ColorJitter with per-sample factors and a per-sample op order.

    Factors: brightness, contrast, saturation ~ U[max(0, 1-v), 1+v], hue ~
    U[-v, v] (v <= 0.5). Each sample applies the enabled ops in its own random
    order (torchvision draws ``randperm(4)`` per image); batched by running
    each op, at each of the four positions, on the samples that have it there.

    On the CPU those samples are gathered with ``nonzero()`` (each op runs on
    its share only); on the device path (:func:`device_path`) each op runs on
    the whole batch and ``torch.where`` keeps it for its samples: four times
    the jitter arithmetic, but no ``nonzero()``, whose count must be copied to
    the host (16 waits for the GPU per call). Every op is per sample, so both
    give the same bits (``tests/test_transforms.py``).
    """

    _OPS: tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ...] = (
        adjust_brightness,
        adjust_contrast,
        adjust_saturation,
        adjust_hue,
    )

    def __init__(
        self,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        hue: float = 0.0,
    ):
        for name, v, hi in (("brightness", brightness, math.inf), ("contrast", contrast, math.inf),
                            ("saturation", saturation, math.inf), ("hue", hue, 0.5)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                raise ConfigError(f"ColorJitter {name} must be a number in [0, {hi}], got {v!r}")
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.saturation, self.hue = float(saturation), float(hue)

    def _ranges(self) -> list[tuple[float, float]]:
        return [
            (max(0.0, 1 - v), 1 + v) for v in (self.brightness, self.contrast, self.saturation)
        ] + [(-self.hue, self.hue)]

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x, "ColorJitter")
        b = x.shape[0]
        u = _rand((b, 8), generator, x.device).to(x.dtype)  # 4 factors + 4 order keys
        ranges = self._ranges()
        factors = [lo + (hi - lo) * u[:, i] for i, (lo, hi) in enumerate(ranges)]
        enabled = [
            i
            for i, v in enumerate((self.brightness, self.contrast, self.saturation, self.hue))
            if v > 0
        ]
        if not enabled:
            return x
        order = torch.argsort(u[:, 4:], dim=1)  # per-sample permutation of the 4 ops
        if device_path(x.device):
            for pos in range(4):
                for op in enabled:
                    here = (order[:, pos] == op).view(-1, 1, 1, 1)
                    x = torch.where(here, self._OPS[op](x, factors[op]), x)
            return x
        x = x.clone()
        for pos in range(4):
            for op in enabled:
                idx = (order[:, pos] == op).nonzero().squeeze(1)
                if idx.numel():
                    x[idx] = self._OPS[op](x[idx], factors[op][idx])
        return x


# --------------------------------------------------------------------------- pipelines


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
