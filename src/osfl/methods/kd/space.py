"""The model-input space that synthetic images live in.

osfl models consume *normalised* float images (``(x/255 - mean) / std``, the
``Normalize`` at the end of the run's eval pipeline). Pixel optimisation
(DeepInversion) works directly in that space, a generator with a sigmoid
output produces [0, 1] pixels that must be normalised, and the synthetic pool
stores model inputs. :class:`InputSpace` is the one place that knows the
mapping, read off the run's eval transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from osfl.data.transforms import Compose, Normalize

__all__ = ["InputSpace"]


@dataclass(frozen=True)
class InputSpace:
    """Per-channel ``mean``/``std`` of the model-input normalisation."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def identity(cls, channels: int) -> InputSpace:
        return cls((0.0,) * channels, (1.0,) * channels)

    @classmethod
    def from_transform(cls, transform: object, channels: int) -> InputSpace:
        """The first ``Normalize`` found in ``transform`` (a Compose is searched
        in order); identity when the pipeline does not normalise."""
        stack: list[object] = [transform]
        while stack:
            t = stack.pop(0)
            if isinstance(t, Normalize):
                if len(t.mean) == channels:
                    return cls(tuple(t.mean), tuple(t.std))
                if len(t.mean) == 1:
                    return cls(t.mean * channels, t.std * channels)
            if isinstance(t, Compose):
                stack = list(t.transforms) + stack
        return cls.identity(channels)

    def _stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        s = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return m, s

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """[0, 1] pixels -> model inputs."""
        m, s = self._stats(pixels)
        return (pixels - m) / s

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs -> [0, 1] pixels (for pictures)."""
        m, s = self._stats(x)
        return x * s + m

    def bounds(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model-input images of pixel values 0 and 1, (1, C, 1, 1) each."""
        m, s = self._stats(like)
        return (0 - m) / s, (1 - m) / s

    def clip(self, x: torch.Tensor) -> torch.Tensor:
        """Clamp model inputs to the image of the valid pixel range [0, 1]."""
        lo, hi = self.bounds(x)
        return torch.maximum(torch.minimum(x, hi), lo)

    def to_uint8(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs -> uint8 images (for saving pictures)."""
        return (self.denormalize(x).clamp(0, 1) * 255).round().to(torch.uint8)

    @property
    def channels(self) -> int:
        return len(self.mean)

    def with_channels(self, channels: int) -> InputSpace:
        if channels == self.channels:
            return self
        return InputSpace(_fit(self.mean, channels), _fit(self.std, channels))


def _fit(v: Sequence[float], n: int) -> tuple[float, ...]:
    return tuple(v) * n if len(v) == 1 else tuple(v[:n])
