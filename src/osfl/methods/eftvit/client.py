"""EFTViT's client side: masked-image training of the local module (§3.3, §3.5).

The client's network is one ViT split at block M (:class:`EFTViTNet`): the
*local module* (patch embedding, class token, position embedding and blocks
0..M-1) and the head train, the *global module* (blocks M..L-1 and the final
norm) is frozen — gradients flow through it to the local module, which is
what Eq. 2 minimises. Per image and per step a fresh random subset of the
patches is kept (:class:`MaskedTraining`, ratio r masked, MAE's
``int(N·(1-r))`` kept, sorted); the position embedding is added before the
gather, so every kept token keeps its own position. The local module's
output tokens of each step are recorded: they are the patch features that
median sampling draws from (features of every epoch for minority classes,
of the last epoch for the others).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.models.vit import VisionTransformer, random_keep_idx


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """Patches kept at ``mask_ratio`` (MAE: ``int(N·(1-r))``; float noise removed)."""
    return math.floor(num_patches * (1.0 - mask_ratio) + 1e-9)


def local_names(vit: VisionTransformer, local_depth: int) -> list[str]:
    """Parameter names of the local module (patch embedding, class/register
    tokens, position embedding, blocks 0..M-1), as in the full model."""
    bottom, _ = vit.split(local_depth)
    return [n for n, _ in bottom.named_parameters()]


def head_names(vit: VisionTransformer) -> list[str]:
    prefix = vit.classifier_name + "."
    return [n for n, _ in vit.named_parameters() if n.startswith(prefix)]


class EFTViTNet(nn.Module):
    """A ViT seen as local module (``bottom``) + global module and head (``top``);
    ``forward(x, keep_idx)`` equals the ViT's. Parameters are the ViT's."""

    def __init__(self, vit: VisionTransformer, local_depth: int):
        super().__init__()
        depth = len(vit.blocks)
        if not 1 <= local_depth < depth:
            raise ConfigError(
                f"local_depth must lie in [1, {depth - 1}] for a {depth}-block ViT, got {local_depth}"
            )
        self.vit = vit
        self.local_depth = local_depth
        self.bottom, self.top = vit.split(local_depth)

    @property
    def num_patches(self) -> int:
        return self.vit.num_patches

    def forward(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        return self.top(self.bottom(x, keep_idx))


class MaskedTraining:
    """The client's loss for :func:`~osfl.fl.training.train_local` (its
    ``loss_fn``): cross-entropy on the kept tokens of a fresh random mask per
    image and step, recording per step the local module's output tokens
    (float32, on the training device), the labels and the kept indices (CPU)."""

    def __init__(self, num_keep: int, generator: torch.Generator):
        self.num_keep = num_keep
        self.generator = generator
        self.tokens: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []

    def draw(self, batch: int, num_patches: int) -> torch.Tensor:
        """Sorted kept patch indices (B × K), a fresh draw per image."""
        return random_keep_idx(batch, num_patches, self.num_keep, generator=self.generator)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        net: EFTViTNet = model  # type: ignore[assignment]
        keep = self.draw(x.shape[0], net.num_patches)
        tokens = net.bottom(x, keep.to(x.device))
        # kept on the device (no host sync per step); median sampling gathers them
        self.tokens.append(tokens.detach().float())
        self.labels.append(y.detach())
        self.kept.append(keep)
        return F.cross_entropy(net.top(tokens).float(), y)
