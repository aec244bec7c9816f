"""MAE: masked autoencoders.

He, Chen, Xie, Li, Dollár, Girshick, "Masked Autoencoders Are Scalable Vision
Learners", CVPR 2022 (§3):

- a random subset of patches is kept (mask ratio 75 %, uniform per image);
  the *encoder* (the ViT) runs on the kept patches only — here through the
  ViT's ``keep_idx`` token subsets, with position embeddings added before the
  gather so every kept token carries its own position;
- a light *decoder* sees the encoded tokens plus a shared, learned mask token
  at every masked position, with its own (fixed 2-D sine-cosine) position
  embeddings, and predicts each patch's pixels with a linear layer;
- the loss is the mean squared error on the *masked* patches only, on
  per-patch normalised pixels (``norm_pix_loss``, the paper's default, which
  it finds improves representations).

Scaled-down differences (docs/pretrain.md): the decoder's width/depth
(``MaeConfig``); the encoder's position embeddings stay learned (the paper
fixes them to sine-cosine too); a constant weight decay on every parameter.
The written encoder is the ViT itself (no mask token in the file).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import (
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToFloat,
    Transform,
    build_transform,
)
from osfl.errors import ConfigError
from osfl.models.layers import Block, LayerNorm
from osfl.models.vit import VisionTransformer, random_keep_idx
from osfl.pretrain.config import PretrainConfig
from osfl.pretrain.objectives import Objective, ObjectiveContext, batches, register_objective


def sincos_pos_embed(dim: int, grid: tuple[int, int]) -> torch.Tensor:
    """(1, 1 + gh·gw, dim) fixed 2-D sine-cosine embeddings, a zero row for the
    class token first (MAE's ``get_2d_sincos_pos_embed``: half the channels
    encode the row, half the column, each as sin/cos of 1/10000^(2i/d))."""
    if dim % 4:
        raise ConfigError(f"mae.decoder_dim must be a multiple of 4, got {dim}")
    gh, gw = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))

    def axis(pos: torch.Tensor) -> torch.Tensor:
        out = pos.reshape(-1, 1).double() * omega.view(1, -1)
        return torch.cat([out.sin(), out.cos()], dim=1)

    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    emb = torch.cat([axis(cols), axis(rows)], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=emb.dtype), emb]).float().unsqueeze(0)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, p·p·C) in the patch embedding's row-major order."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), p * p * c)


@register_objective
class Mae(Objective):
    """MAE masked reconstruction (see the module docstring). Held-out: the
    reconstruction loss on un-augmented held-out images with seeded masks."""

    name = "mae"

    @staticmethod
    def options_from(cfg: PretrainConfig) -> Any:
        return cfg.mae

    def __init__(self, model: nn.Module, options: Any, ctx: ObjectiveContext):
        super().__init__(model, options, ctx)
        if not isinstance(model, VisionTransformer):
            raise ConfigError(f"mae pretrains a ViT, got {type(model).__name__}")
        n = model.num_patches
        self.keep = max(1, round(n * (1 - options.mask_ratio)))
        if self.keep >= n:
            raise ConfigError(f"mae.mask_ratio {options.mask_ratio} masks no patch of {n}")
        d, dd = model.embed_dim, options.decoder_dim
        self.patch = model.patch_embed.patch_size[0]
        in_chans = model.patch_embed.proj.in_channels
        self.decoder_embed = nn.Linear(d, dd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dd))
        self.register_buffer("decoder_pos_embed", sincos_pos_embed(dd, model.patch_embed.grid_size))
        self.decoder_blocks = nn.Sequential(
            *[Block(dd, options.decoder_heads) for _ in range(options.decoder_depth)]
        )
        self.decoder_norm = LayerNorm(dd)
        self.decoder_pred = nn.Linear(dd, self.patch * self.patch * in_chans)
        nn.init.normal_(self.mask_token, std=0.02)
        for m in [self.decoder_embed, *self.decoder_blocks.modules(), self.decoder_pred]:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)  # MAE's initialisation of its linears
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.augment: Transform = Compose(
            [
                ToFloat(),
                RandomResizedCrop(ctx.image_size, scale=(options.crop_min_scale, 1.0)),
                RandomHorizontalFlip(),
                Normalize(ctx.mean, ctx.std),
            ]
        )
        self.plain: Transform = build_transform(
            "none", image_size=ctx.image_size, mean=ctx.mean, std=ctx.std
        )

    def reconstruction_loss(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Encode a random ``keep`` patches per image, decode all, MSE on the masked."""
        vit = self.model
        b, n = x.shape[0], vit.num_patches
        keep_idx = random_keep_idx(b, n, self.keep, generator=generator).to(x.device)
        latent = self.decoder_embed(vit.forward_tokens(x, keep_idx))
        dd = latent.shape[-1]
        full = self.mask_token.expand(b, n, dd).to(latent.dtype)
        index = keep_idx.unsqueeze(-1).expand(-1, -1, dd)
        full = full.scatter(1, index, latent[:, vit.num_prefix_tokens :])
        seq = torch.cat([latent[:, :1], full], dim=1) + self.decoder_pos_embed
        pred = self.decoder_pred(self.decoder_norm(self.decoder_blocks(seq)))[:, 1:]
        target = patchify(x, self.patch)
        if self.options.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1e-6).sqrt()
        per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)
        masked = torch.ones(b, n, device=x.device).scatter_(1, keep_idx, 0.0)
        return (per_patch * masked).sum() / masked.sum()

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.reconstruction_loss(self.augment(x, self.ctx.generator), self.ctx.generator)

    @torch.no_grad()
    def evaluate(self, held_out: ImageSet) -> dict[str, float]:
        self.eval()
        gen = torch.Generator().manual_seed(0)  # the same masks for every encoder
        total, n = 0.0, 0
        for x, _ in batches(held_out, self.ctx.device):
            total += float(self.reconstruction_loss(self.plain(x), gen)) * x.shape[0]
            n += x.shape[0]
        return {"loss": total / n}
