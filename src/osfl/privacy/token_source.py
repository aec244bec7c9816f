"""The input contract of the token-inversion attack
(:mod:`osfl.privacy.token_inversion`): plain tensors behind two small
Protocols, so the attack runs on any encoder and any upload without a Method
object or the simulator (as breaching's attacks take the server's payload and
shared data; Geiping et al., "Inverting Gradients", NeurIPS 2020).

- :class:`TokenEncoder` — the public images -> tokens map every party can
  compute: ``encode(images, device)`` takes uint8 images (N, C, H, W) and
  returns float32 token sequences (N, V, D) — V views of one D-dim token per
  image — on any device (the attack moves them); ``num_views`` = V and
  ``dim`` = D are known before anything is encoded.
- :class:`TokenSource` — the adapter for one kind of upload: its ``encode``
  (a TokenEncoder) and ``synthetic(obs, generator)``, the float32 token
  sequences (M, V, D) the server holds from the observed upload (read as is,
  decoded or sampled with ``generator``, a seeded CPU ``torch.Generator``;
  M may be 0).

Where a method-specific step is needed — rebuild a frozen encoder and its
views from an Observation, decode FALCON's generator upload, sample FedPFT's
class mixtures — the adapter lives next to the method
(:mod:`osfl.methods.frozen.inversion`, :mod:`osfl.methods.falcon.inversion`,
:mod:`osfl.methods.fedpft_inversion`); this package imports nothing from
:mod:`osfl.methods`. The two plain adapters here need no method:
:class:`CallableTokenEncoder` (any function or ``nn.Module`` images ->
tokens) and :class:`FixedTokens` (sequences already in hand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import nn

from osfl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from osfl.fl.observation import Observation

__all__ = ["CallableTokenEncoder", "FixedTokens", "TokenEncoder", "TokenSource"]


@runtime_checkable
class TokenEncoder(Protocol):
    """uint8 images (N, C, H, W) -> float32 token sequences (N, V, D)."""

    @property
    def num_views(self) -> int:
        """V, the tokens per image."""

    @property
    def dim(self) -> int:
        """D, the width of one token."""

    def __call__(self, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """Encode ``images`` (computing on ``device``), without gradients."""


@runtime_checkable
class TokenSource(Protocol):
    """What the attack needs from one observed upload (module docstring)."""

    @property
    def encode(self) -> TokenEncoder:
        """The public encoder the client's tokens came from."""

    def synthetic(self, obs: Observation, generator: torch.Generator) -> torch.Tensor:
        """float32 (M, V, D): the sequences the server holds from ``obs``'s upload."""


class CallableTokenEncoder:
    """Any images -> tokens function as a :class:`TokenEncoder`: ``fn`` gets
    a uint8 batch (B, C, H, W) on the device and returns (B, V, D); an
    ``nn.Module`` is moved to the device and put in eval mode first."""

    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        num_views: int,
        dim: int,
        *,
        batch_size: int = 128,
    ):
        for name, v in (("num_views", num_views), ("dim", dim), ("batch_size", batch_size)):
            if v < 1:
                raise ConfigError(f"CallableTokenEncoder: {name} must be >= 1, got {v}")
        self.fn, self.batch_size = fn, batch_size
        self._shape = (num_views, dim)

    @property
    def num_views(self) -> int:
        return self._shape[0]

    @property
    def dim(self) -> int:
        return self._shape[1]

    def __call__(self, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        device = torch.device(device)
        if isinstance(self.fn, nn.Module):
            self.fn.to(device).eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(images), self.batch_size):
                out.append(self.fn(images[i : i + self.batch_size].to(device)).float().cpu())
        tokens = torch.cat(out) if out else torch.zeros(0, *self._shape)
        if tuple(tokens.shape[1:]) != self._shape:
            raise DataError(
                f"the token encoder returned shape {tuple(tokens.shape)}, "
                f"expected (N, {self._shape[0]}, {self._shape[1]})"
            )
        return tokens


@dataclass(frozen=True)
class FixedTokens:
    """A :class:`TokenSource` for sequences already in hand (e.g. token
    tensors an upload carries): ``synthetic`` returns ``sequences`` (M, V, D)
    as float32 whatever the Observation."""

    encode: TokenEncoder
    sequences: torch.Tensor

    def synthetic(self, obs: Observation, generator: torch.Generator) -> torch.Tensor:
        return self.sequences.float()
