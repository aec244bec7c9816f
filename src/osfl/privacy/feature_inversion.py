"""Feature inversion: can a server turn uploaded patch features back into images?

EFTViT (§3.6 and Fig. 5 of its paper) uploads the local module's output
tokens of masked images and argues they are hard to invert: only 25 % of the
patches are encoded, and a decoder fed with the features of the first M
blocks at various rounds reconstructs heavily distorted images. This module
is that attack, on what an honest-but-curious server holds:

- the **pretrained local module** (public: every client starts from it) and
  an **auxiliary image set** from the task's distribution; the attacker trains
  a decoder (:class:`FeatureDecoder`) to map the pretrained module's tokens of
  randomly masked aux images back to the whole image
  (:func:`train_feature_decoder`, MSE in pixel space, Adam);
- the **uploads** (``features.<class>`` tensors of an Observation): the
  decoder reconstructs them (:func:`invert_upload`). The clients' local
  modules drift from the pretrained one over the rounds, which the decoder
  never saw: scoring reconstructions round by round gives Fig. 5's curve.

The decoder needs no patch indices: the tokens carry their position
embedding (added before the local blocks), and one learned query per patch
position cross-attends to the set of uploaded tokens (a Transformer decoder,
as in DETR/Perceiver-style set decoders) and emits that patch's pixels. The
same attack on **unmasked** features (``mask_ratio=0``: a decoder trained
and applied on all tokens) is the comparison without EFTViT's masking.

Scores: PSNR/SSIM (:mod:`osfl.privacy.metrics`) after pairing each
reconstruction with its most similar original of the client's images of the
same class by a minimum-MSE assignment (:func:`match_scores`; the upload does
not say which image a feature came from), which favours the attacker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from osfl.errors import ConfigError
from osfl.models.vit import random_keep_idx
from osfl.privacy.metrics import psnr, ssim

#: images (B, C, H, W) in [0, 1] and kept patch indices (B, K) or None -> tokens (B, T, D)
Encoder = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
FEATURE_PREFIX = "features."


class FeatureDecoder(nn.Module):
    """Tokens (B × T × D, any T) -> images (B × C × H × W) in [0, 1].

    One learned query per patch of the ``grid`` cross-attends to the tokens
    through ``depth`` pre-norm Transformer-decoder layers of ``width``; a
    linear layer turns each query into its patch's pixels (sigmoid)."""

    def __init__(
        self,
        embed_dim: int,
        grid: tuple[int, int],
        patch: tuple[int, int],
        channels: int,
        *,
        width: int = 128,
        depth: int = 2,
        heads: int = 4,
    ):
        super().__init__()
        self.grid, self.patch, self.channels = grid, patch, channels
        self.inp = nn.Linear(embed_dim, width)
        self.queries = nn.Parameter(0.02 * torch.randn(1, grid[0] * grid[1], width))
        layer = nn.TransformerDecoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, depth)
        self.out = nn.Linear(width, patch[0] * patch[1] * channels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        h = self.decoder(self.queries.expand(b, -1, -1), self.inp(tokens))
        pix = torch.sigmoid(self.out(h))  # B × N × (ph·pw·C)
        (gh, gw), (ph, pw), c = self.grid, self.patch, self.channels
        pix = pix.reshape(b, gh, gw, ph, pw, c).permute(0, 5, 1, 3, 2, 4)
        return pix.reshape(b, c, gh * ph, gw * pw)


@dataclass(frozen=True)
class DecoderConfig:
    """The attacker's decoder and its training: ``mask_ratio`` of the features it
    learns to invert (the clients' r; 0 = unmasked), Adam ``steps`` × ``batch_size``."""

    mask_ratio: float = 0.75
    width: int = 128
    depth: int = 2
    heads: int = 4
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ConfigError(f"mask_ratio must lie in [0, 1), got {self.mask_ratio}")
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ConfigError("steps and batch_size must be >= 1 and lr > 0")


def kept_count(num_patches: int, mask_ratio: float) -> int:
    return max(1, int(np.floor(num_patches * (1.0 - mask_ratio) + 1e-9)))


def encode(
    encoder: Encoder,
    images: torch.Tensor,
    num_patches: int,
    mask_ratio: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Tokens of ``images`` under a fresh random mask per image (none when r = 0)."""
    if mask_ratio == 0.0:
        return encoder(images, None)
    keep = random_keep_idx(
        images.shape[0], num_patches, kept_count(num_patches, mask_ratio), generator=generator
    )
    return encoder(images, keep.to(images.device))


def train_feature_decoder(
    encoder: Encoder,
    images: torch.Tensor,
    *,
    embed_dim: int,
    grid: tuple[int, int],
    patch: tuple[int, int],
    cfg: DecoderConfig = DecoderConfig(),
    to_input: Callable[[torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
) -> FeatureDecoder:
    """Train a :class:`FeatureDecoder` on auxiliary ``images`` (N × C × H × W in
    [0, 1]) encoded by ``encoder`` (frozen; e.g. the pretrained local module
    ``ViTBottom``) under random masks of ``cfg.mask_ratio``. ``to_input`` maps
    [0, 1] images to the encoder's input (its normalisation; default none)."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        decoder = FeatureDecoder(
            embed_dim,
            grid,
            patch,
            images.shape[1],
            width=cfg.width,
            depth=cfg.depth,
            heads=cfg.heads,
        )
    decoder.to(device).train()
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(decoder.parameters(), lr=cfg.lr)
    num_patches = grid[0] * grid[1]
    for _ in range(cfg.steps):
        idx = torch.randint(len(images), (min(cfg.batch_size, len(images)),), generator=gen)
        target = images[idx].to(device)
        with torch.no_grad():
            x = to_input(target) if to_input is not None else target
            tokens = encode(encoder, x, num_patches, cfg.mask_ratio, gen)
        loss = F.mse_loss(decoder(tokens.float()), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return decoder.eval()


@torch.no_grad()
def reconstruct(decoder: FeatureDecoder, tokens: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Images the decoder makes of ``tokens`` (N × T × D), on CPU."""
    dev = next(decoder.parameters()).device
    outs = [
        decoder(tokens[i : i + batch].to(dev).float()).cpu() for i in range(0, len(tokens), batch)
    ]
    return torch.cat(outs) if outs else tokens.new_zeros(0)


def invert_upload(
    decoder: FeatureDecoder, tensors: Mapping[str, torch.Tensor]
) -> dict[int, torch.Tensor]:
    """Reconstructions of an EFTViT upload (``features.<class>`` tensors, e.g.
    ``Observation.upload``), per class."""
    return {
        int(k[len(FEATURE_PREFIX) :]): reconstruct(decoder, v)
        for k, v in sorted(tensors.items())
        if k.startswith(FEATURE_PREFIX)
    }


def match_scores(recon: torch.Tensor, originals: torch.Tensor) -> dict[str, float]:
    """Mean PSNR/SSIM of reconstructions paired with originals by a minimum-MSE
    assignment (rectangular: ``min(len(recon), len(originals))`` pairs)."""
    if recon.shape[1:] != originals.shape[1:]:
        raise ConfigError(f"image shapes differ: {tuple(recon.shape)} vs {tuple(originals.shape)}")
    cost = torch.cdist(recon.float().flatten(1), originals.float().flatten(1)).pow(2).numpy()
    rows, cols = linear_sum_assignment(cost)
    r, o = recon[torch.as_tensor(rows)], originals[torch.as_tensor(cols)]
    return {"psnr": float(psnr(r, o).mean()), "ssim": float(ssim(r, o).mean()), "pairs": len(rows)}


def score_upload(
    decoder: FeatureDecoder,
    tensors: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
) -> dict[str, float]:
    """Invert one upload and score it against the client's images (N × C × H × W
    in [0, 1], with their labels) class by class; means weighted by pairs."""
    per_class = invert_upload(decoder, tensors)
    total = {"psnr": 0.0, "ssim": 0.0, "pairs": 0}
    for c, rec in per_class.items():
        own = images[labels == c]
        if len(own) == 0 or len(rec) == 0:
            continue
        s = match_scores(rec, own)
        total["psnr"] += s["psnr"] * s["pairs"]
        total["ssim"] += s["ssim"] * s["pairs"]
        total["pairs"] += s["pairs"]
    if total["pairs"] == 0:
        raise ConfigError("no class of the upload has an image to score against")
    return {
        "psnr": total["psnr"] / total["pairs"],
        "ssim": total["ssim"] / total["pairs"],
        "pairs": total["pairs"],
    }


def inversion_curve(
    decoder: FeatureDecoder,
    encoders: Mapping[int, Encoder],
    images: torch.Tensor,
    *,
    num_patches: int,
    mask_ratio: float,
    to_input: Callable[[torch.Tensor], torch.Tensor] | None = None,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Fig. 5's shape: for each round t, encode ``images`` (in [0, 1]) with the
    round-t local module ``encoders[t]`` under fresh masks, invert with the
    decoder, and score against the images themselves (known pairing)."""
    device = next(decoder.parameters()).device
    out = []
    for t in sorted(encoders):
        gen = torch.Generator().manual_seed(seed)
        x = images.to(device)
        with torch.no_grad():
            tokens = encode(
                encoders[t], to_input(x) if to_input else x, num_patches, mask_ratio, gen
            )
        rec = reconstruct(decoder, tokens)
        out.append(
            {
                "round": t,
                "psnr": float(psnr(rec, images).mean()),
                "ssim": float(ssim(rec, images).mean()),
            }
        )
    return out
