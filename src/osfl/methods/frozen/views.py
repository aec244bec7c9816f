"""Views of an image for a frozen encoder: the global view and FALCON's
sliding-window region views (hierarchical scale encoding, HSE).

Liu et al., FALCON (2025), §2.3 and Fig. 3: the global view x⁽⁰⁾ is the whole
image resized to the encoder's input size; the region views x⁽¹⁾..x⁽ᴸ⁾ are
windows of fixed size and stride over the image *at its original
resolution* (the paper first resizes every image to 448×448 and uses 224 px
windows with stride 224: L = 4). Encoded one by one they give the
hierarchical token sequence s = [s⁽⁰⁾, s⁽¹⁾, …, s⁽ᴸ⁾], coarse to fine.

Here "original resolution" is :class:`HSEConfig`'s ``input_size`` (the data's
own size by default): the image is resized to it, then cut into windows in
row-major order (top-left first). A window whose size differs from the
encoder's is resized to it. The global view is resized from the image as it
comes (not from the ``input_size`` copy), so it is the very view FedPFT and
FedCGS encode and their cached tokens are shared with FALCON's s⁽⁰⁾.

Views act on *normalised* float batches (the run's evaluation transform has
already run): resizing commutes with per-channel normalisation, so nothing
is normalised twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from osfl.data.transforms import Resize
from osfl.errors import ConfigError

__all__ = ["HSEConfig", "ViewSet", "global_view", "num_windows", "region_views"]


@dataclass(frozen=True)
class HSEConfig:
    """Sliding-window region views (paper: 448 / 224 / 224).

    ``input_size``: the resolution the windows are cut from (``null``: the
    image's own size); ``window``: window side (``null``: the encoder's input
    size); ``stride``: step between windows (``null``: ``window``, i.e.
    non-overlapping).
    """

    #: image side the region windows are cut from (null: the image's own)
    input_size: int | None = None
    #: side of a region window (null: the encoder's input size)
    window: int | None = None
    #: step between windows (null: the window, i.e. no overlap)
    stride: int | None = None

    def __post_init__(self) -> None:
        for name in ("input_size", "window", "stride"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"views.{name} must be a positive integer or null, got {v!r}")


def num_windows(input_size: int, window: int, stride: int) -> int:
    """Windows per side: ``(input_size - window) // stride + 1``."""
    if window > input_size:
        raise ConfigError(
            f"views.window={window} is larger than views.input_size={input_size}: "
            "no region fits; lower the window or raise the input size"
        )
    return (input_size - window) // stride + 1


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    return Resize(size)(x)


def global_view(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, 1, C, size, size): the whole image at the encoder's size."""
    return _resize(x, size).unsqueeze(1)


def region_views(
    x: torch.Tensor, size: int, input_size: int, window: int, stride: int
) -> torch.Tensor:
    """(B, C, H, W) -> (B, L, C, size, size): ``window``-px windows with
    ``stride`` over the image resized to ``input_size``, row-major, each
    resized to the encoder's ``size``."""
    n = num_windows(input_size, window, stride)
    x = _resize(x, input_size)
    b, c = x.shape[:2]
    patches = x.unfold(2, window, stride).unfold(3, window, stride)  # B,C,n,n,w,w
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b * n * n, c, window, window)
    if window != size:
        patches = _resize(patches, size)
    return patches.reshape(b, n * n, c, size, size)


@dataclass(frozen=True)
class ViewSet:
    """One family of views, resolved against the encoder: ``kind`` is
    ``"global"`` (one view) or ``"regions"`` (``num_views`` windows).

    :meth:`key` is its identity in token-cache keys.
    """

    kind: str
    size: int
    input_size: int = 0
    window: int = 0
    stride: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("global", "regions"):
            raise ConfigError(f"view kind must be 'global' or 'regions', got {self.kind!r}")
        if self.kind == "regions":
            num_windows(self.input_size, self.window, self.stride)

    @classmethod
    def regions(cls, cfg: HSEConfig, size: int, image_size: int) -> ViewSet:
        """The region views of ``cfg`` for an encoder of input ``size`` and
        images of side ``image_size``."""
        window = cfg.window if cfg.window is not None else size
        stride = cfg.stride if cfg.stride is not None else window
        input_size = cfg.input_size if cfg.input_size is not None else image_size
        return cls("regions", size, input_size, window, stride)

    @property
    def num_views(self) -> int:
        if self.kind == "global":
            return 1
        return num_windows(self.input_size, self.window, self.stride) ** 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "global":
            return global_view(x, self.size)
        return region_views(x, self.size, self.input_size, self.window, self.stride)

    def key(self) -> dict[str, Any]:
        if self.kind == "global":
            return {"kind": "global", "size": self.size}
        return {
            "kind": "regions",
            "size": self.size,
            "input_size": self.input_size,
            "window": self.window,
            "stride": self.stride,
        }
