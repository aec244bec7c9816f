"""Colour on a batch: RGB <-> HSV, the four colour adjustments and
:class:`ColorJitter` (SimCLR's colour distortion, Chen et al., 2020, with
torchvision's ``ColorJitter`` semantics), one random factor per sample and a
random order of the four ops per batch. On the device path (issue #40) the
jitter selects its samples with ``torch.where`` instead of ``nonzero()``,
which would copy a count to the host and wait for the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from osfl.data.batch_transforms import Transform, _check_batch, grayscale
from osfl.data.device_path import _const, _rand, device_path
from osfl.errors import ConfigError, DataError

#: the offsets n of R, G, B in the branch-free HSV -> RGB formula
_HSV_N = (5.0, 3.0, 1.0)


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
    its share only); on the device path (:func:`device_path`) no
    ``nonzero()``, whose count must be copied to the host (16 waits for the
    GPU per call): at each position every sample takes one op, so the three
    blends (brightness, contrast, saturation: ``f·x + (1 - f)·ref`` with ref
    0, the grey mean or the grey image) run as one blend with per-sample
    ``f`` and ref, and hue once, each on the whole batch, ``torch.where``
    keeping each sample's own (issue #50: 8 passes over the batch per call,
    not the 16 of running every op at every position). Every op is per
    sample and the blend is each op's own arithmetic in the same order, so
    both paths give the same bits (``tests/data/test_transforms.py``).
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
        for name, v, hi in (
            ("brightness", brightness, math.inf),
            ("contrast", contrast, math.inf),
            ("saturation", saturation, math.inf),
            ("hue", hue, 0.5),
        ):
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
            if x.shape[1] not in (1, 3):  # (the ops themselves refuse such input)
                for pos in range(4):
                    for op in enabled:
                        here = (order[:, pos] == op).view(-1, 1, 1, 1)
                        x = torch.where(here, self._OPS[op](x, factors[op]), x)
                return x
            for pos in range(4):
                x = _jitter_position(x, order[:, pos], factors, enabled)
            return x
        x = x.clone()
        for pos in range(4):
            for op in enabled:
                idx = (order[:, pos] == op).nonzero().squeeze(1)
                if idx.numel():
                    x[idx] = self._OPS[op](x[idx], factors[op][idx])
        return x


def _jitter_position(
    x: torch.Tensor, op: torch.Tensor, factors: list[torch.Tensor], enabled: list[int]
) -> torch.Tensor:
    """One position of :class:`ColorJitter`'s device path: sample ``i`` takes
    op ``op[i]`` (0 brightness, 1 contrast, 2 saturation, 3 hue) with its
    factor. Brightness, contrast and saturation are one blend ``f·x + (1 -
    f)·ref`` (ref 0, the grey image's mean, the grey image: each op's own
    formula, so the same bits), clamped; hue runs once; grey input keeps
    saturation and hue as identities, as the ops do."""
    grey = x.shape[1] == 1
    sel = op.view(-1, 1, 1, 1)
    out = x
    blends = [i for i in enabled if i < 2 or (i == 2 and not grey)]
    if blends:
        f = factors[blends[-1]]
        for i in reversed(blends[:-1]):
            f = torch.where(op == i, factors[i], f)
        g = x if grey else grayscale(x)
        ref = torch.zeros((), dtype=x.dtype, device=x.device)
        if 2 in blends:
            ref = torch.where(sel == 2, g, ref)
        if 1 in blends:
            ref = torch.where(sel == 1, g.mean(dim=(1, 2, 3), keepdim=True), ref)
        fb = _fac(f)
        blended = (fb * x + (1 - fb) * ref).clamp_(0.0, 1.0)
        here = sel == blends[0]
        for i in blends[1:]:
            here = here | (sel == i)
        out = torch.where(here, blended, out)
    if 3 in enabled and not grey:
        out = torch.where(sel == 3, adjust_hue(x, factors[3]), out)
    return out
