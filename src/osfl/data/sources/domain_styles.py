"""Image styles that turn one image set into several domains (feature non-IID).

Feature-skew experiments need the *same* classes seen through different
"cameras" (PACS: photo, art painting, cartoon, sketch — Li et al., "Deeper,
Broader and Artier Domain Generalization", ICCV 2017; MNIST → MNIST-M — Ganin &
Lempitsky, "Unsupervised Domain Adaptation by Backpropagation", ICML 2015).
These styles derive such domains offline from any image set:

- ``photo``: the image unchanged;
- ``sketch``: a pencil drawing — the Sobel gradient magnitude of the luma,
  divided by its per-image maximum and inverted (dark strokes on white paper),
  the same value in all three channels;
- ``cartoon``: flat colours and ink outlines — a 3×3 median blur (an
  edge-preserving stand-in for the bilateral filter of classic cartoonisation),
  each channel posterised to :data:`CARTOON_LEVELS` levels mapped through a
  palette drawn once per domain (:func:`cartoon_palette`; so grey inputs get a
  colour tint), and outlines inked with the darkest palette colour on the dark
  side of strong edges (Sobel magnitude above :data:`CARTOON_EDGE` × the
  image's maximum and luma below its 3×3 mean, like the adaptive-threshold
  edge mask of OpenCV-style cartoonisation) — so every channel holds at most
  :data:`CARTOON_LEVELS` values;
- ``mnistm``: MNIST-M's blend ``|texture − image|`` per channel, with the
  texture generated procedurally (multi-octave value noise per channel, a
  random contrast range per image and channel) instead of cropped from BSDS500
  photos, so nothing is downloaded.

A style maps uint8 N×3×H×W to uint8 N×3×H×W with whole-batch tensor ops (no
per-sample loop) and draws randomness from two ``torch.Generator``\\ s: ``look``
(seeded by the domain only: what makes the domain one style, the same for the
train and the test split) and ``draw`` (seeded by domain and split: per-image
draws such as the textures). Styles are registered in :data:`STYLES`.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from osfl.data.sources.common import LUMA
from osfl.registry import Registry

#: Posterisation levels per channel of ``cartoon``.
CARTOON_LEVELS = 4
#: Fraction of the image's largest Sobel magnitude above which ``cartoon`` inks a pixel.
CARTOON_EDGE = 0.4
#: Range of the per-channel tone-curve exponent of ``cartoon`` (log-uniform).
CARTOON_GAMMA = (0.5, 2.0)
#: Value-noise grid sizes (coarse to fine) of the ``mnistm`` textures, amplitude 1/2^octave.
TEXTURE_GRIDS = (2, 4, 8)

_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


class DomainStyle(Protocol):
    """uint8 N×3×H×W -> uint8 N×3×H×W, randomness from ``look`` (per domain) and ``draw``."""

    def __call__(
        self, images: torch.Tensor, look: torch.Generator, draw: torch.Generator
    ) -> torch.Tensor: ...


#: name -> style; the names are the ``domains`` option of the ``domains:`` source.
STYLES: Registry[DomainStyle] = Registry("domain")

#: The domains made when none are named.
DEFAULT_DOMAINS = ("photo", "sketch", "cartoon", "mnistm")


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return x.round_().clamp_(0, 255).to(torch.uint8)


def luma(images: torch.Tensor) -> torch.Tensor:
    """uint8 N×3×H×W -> float N×1×H×W grey level (ITU-R 601-2, as Pillow's ``L``)."""
    w = torch.tensor(LUMA, dtype=torch.float32).view(1, 3, 1, 1)
    return (images.float() * w).sum(1, keepdim=True)


def sobel_magnitude(gray: torch.Tensor) -> torch.Tensor:
    """float N×1×H×W -> gradient magnitude N×1×H×W (3×3 Sobel, replicated border)."""
    kernels = torch.stack([_SOBEL_X, _SOBEL_X.t()]).unsqueeze(1)  # 2×1×3×3
    g = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), kernels)
    return g.pow(2).sum(1, keepdim=True).sqrt()


def _per_image_max(x: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)


#: Compare-exchange pairs of the 9-input median network (Paeth, "Median Finding on a
#: 3×3 Grid", Graphics Gems 1990; the ``opt_med9`` of Devillard): the median ends at 4.
_MEDIAN9 = (
    (1, 2), (4, 5), (7, 8), (0, 1), (3, 4), (6, 7), (1, 2), (4, 5), (7, 8), (0, 3),
    (5, 8), (4, 7), (3, 6), (1, 4), (2, 5), (4, 7), (4, 2), (6, 4), (4, 2),
)  # fmt: skip


def median3(images: torch.Tensor) -> torch.Tensor:
    """3×3 median filter of a uint8 N×C×H×W batch (replicated border), on uint8.

    The 9 shifted views go through a min/max sorting network: same result as
    ``torch.median`` over unfolded windows, about 4× faster.
    """
    h, w = images.shape[-2:]
    padded = F.pad(images, (1, 1, 1, 1), mode="replicate")
    v = [padded[..., i : i + h, j : j + w] for i in range(3) for j in range(3)]
    for a, b in _MEDIAN9:
        v[a], v[b] = torch.minimum(v[a], v[b]), torch.maximum(v[a], v[b])
    return v[4].contiguous()


def texture(n: int, h: int, w: int, draw: torch.Generator) -> torch.Tensor:
    """``n`` colour textures, float N×3×H×W in [0, 255] (the ``mnistm`` background).

    Each channel is value noise: uniform noise on 2×2, 4×4 and 8×8 grids,
    bilinearly upsampled and summed with amplitudes 1, 1/2, 1/4, then stretched
    to a random range [lo, hi] with lo ~ U(0, 128), hi ~ U(128, 255).
    """
    acc = torch.zeros(n, 3, h, w)
    for octave, grid in enumerate(TEXTURE_GRIDS):
        noise = torch.rand(n, 3, grid, grid, generator=draw)
        up = F.interpolate(noise, size=(h, w), mode="bilinear", align_corners=False)
        acc += up / 2**octave
    lo = acc.amin(dim=(2, 3), keepdim=True)
    span = (acc.amax(dim=(2, 3), keepdim=True) - lo).clamp_min(1e-6)
    low = torch.rand(n, 3, 1, 1, generator=draw) * 128
    high = 128 + torch.rand(n, 3, 1, 1, generator=draw) * 127
    return low + (high - low) * (acc - lo) / span


def cartoon_palette(look: torch.Generator) -> torch.Tensor:
    """uint8 3×k: channel ``c``'s value for level ``j`` is
    ``lo_c + (hi_c − lo_c)·(j/(k−1))^γ_c`` with lo ~ U(0, 96), hi ~ U(160, 255),
    γ log-uniform in :data:`CARTOON_GAMMA`, drawn once per domain — different
    curves per channel tint even grey inputs; increasing in ``j``."""
    k = CARTOON_LEVELS
    lo = torch.rand(3, 1, generator=look) * 96
    hi = 160 + torch.rand(3, 1, generator=look) * 95
    g_lo, g_hi = (torch.tensor(g).log() for g in CARTOON_GAMMA)
    gamma = (g_lo + (g_hi - g_lo) * torch.rand(3, 1, generator=look)).exp()
    steps = torch.arange(k, dtype=torch.float32).unsqueeze(0) / (k - 1)
    return _to_uint8(lo + (hi - lo) * steps**gamma)


@STYLES.register("photo")
def photo(images: torch.Tensor, look: torch.Generator, draw: torch.Generator) -> torch.Tensor:
    """The source image (the reference domain)."""
    return images.clone()


@STYLES.register("sketch")
def sketch(images: torch.Tensor, look: torch.Generator, draw: torch.Generator) -> torch.Tensor:
    """Inverted, per-image normalised Sobel magnitude of the luma, grey in all channels."""
    mag = sobel_magnitude(luma(images))
    paper = 255.0 * (1.0 - mag / _per_image_max(mag))
    return _to_uint8(paper).expand(-1, 3, -1, -1).contiguous()


@STYLES.register("cartoon")
def cartoon(images: torch.Tensor, look: torch.Generator, draw: torch.Generator) -> torch.Tensor:
    """Median blur, posterise each channel with the domain's palette, ink the edges."""
    smooth = median3(images)
    palette = cartoon_palette(look)
    level = (smooth.long() * CARTOON_LEVELS) // 256  # N×3×H×W in 0..k-1
    out = torch.stack([palette[c][level[:, c]] for c in range(3)], dim=1)
    gray = luma(smooth)
    mag = sobel_magnitude(gray)
    local = F.avg_pool2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    ink = (mag > CARTOON_EDGE * _per_image_max(mag)) & (gray < local)  # dark side of edges
    return torch.where(ink, palette[:, :1].view(1, 3, 1, 1), out)


@STYLES.register("mnistm")
def mnistm(images: torch.Tensor, look: torch.Generator, draw: torch.Generator) -> torch.Tensor:
    """MNIST-M blend: ``|texture − image|`` per channel, one fresh texture per image."""
    n, _, h, w = images.shape
    return _to_uint8((texture(n, h, w, draw) - images.float()).abs())
