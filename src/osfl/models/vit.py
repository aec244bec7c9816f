"""Vision Transformer / DeiT with timm's parameter names, plus the token-level
extras the one-shot and efficient-ViT methods need.

References: Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021);
Touvron et al., "Training data-efficient image transformers" (DeiT, ICML 2021);
Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision"
(TMLR 2024) and Darcet et al., "Vision Transformers Need Registers" (ICLR 2024)
for the DINOv2 family (patch 14, layer scale ``init_values=1e-5``, optional
register tokens). The module layout and every parameter name follow timm's
``timm/models/vision_transformer.py`` (``patch_embed.proj``, ``cls_token``,
``reg_token``, ``pos_embed``,
``blocks.{i}.norm1/attn.qkv/attn.proj/ls1/norm2/mlp.fc1/mlp.fc2/ls2``, ``norm``,
``fc_norm``, ``head``) so that timm / DeiT checkpoints load unchanged; other
layouts (Hugging Face, facebookresearch/dinov2) are renamed by
:mod:`osfl.models.layouts`.

Register tokens sit between the class token and the patches and carry no
position embedding, as in the original DINOv2 code and Hugging Face's
``Dinov2WithRegistersModel``: ``pos_embed`` is always (1, 1 + N, D), class
position first (timm's own ``*_reg4_dinov2`` checkpoints fold the class
position into ``cls_token``; the loader converts).

Extras (beyond timm):

- ``keep_idx``: forward on a subset of patch tokens. The position embedding is
  added to *all* patch tokens before the gather, so a kept token keeps its
  position; ``keep_idx`` indexes patches only, and the class and register
  tokens are always kept. Sparse Model Inversion (SMI, used by FedMITR) and
  EFTViT's masked training rely on it.
- :meth:`VisionTransformer.attention_maps`: class-token-to-patch attention of
  any block (SMI ranks patches by the last block's, averaged over heads);
  register columns are left out.
- :meth:`VisionTransformer.split`: bottom (embedding + first ``m`` blocks) and
  top (remaining blocks + norm + head) sharing the parameters (EFTViT trains the
  bottom on clients and the top on the server from uploaded tokens).
- :meth:`VisionTransformer.token_logits`: the head applied to the class token
  and every kept patch token (FedMITR's token relabelling); register tokens
  are left out, so the shape is (B, 1 + K, C) with or without registers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.models.layers import (
    Block,
    ImageClassifier,
    LayerNorm,
    PatchEmbed,
    check_positive,
    get_act_layer,
)
from osfl.models.registry import register_model

# --- token plumbing shared by the full model, its bottom/top halves and encoder ---

#: Pooling name -> (tokens (B, P+K, D), number of prefix tokens P) -> (B, D).
#: "avg" averages the patch tokens only, as timm does with registers.
_POOLS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "token": lambda t, num_prefix: t[:, 0],
    "avg": lambda t, num_prefix: t[:, num_prefix:].mean(dim=1),
}


def _check_keep_idx(keep_idx: torch.Tensor, batch: int, num_patches: int) -> torch.Tensor:
    if keep_idx.dtype not in (torch.int64, torch.int32):
        raise ConfigError(f"keep_idx must be an integer tensor, got {keep_idx.dtype}")
    if keep_idx.ndim == 1:
        keep_idx = keep_idx.unsqueeze(0).expand(batch, -1)
    if keep_idx.ndim != 2 or keep_idx.shape[0] != batch:
        raise ConfigError(
            f"keep_idx must be (B, K) = ({batch}, K) or (K,), got {tuple(keep_idx.shape)}"
        )
    if keep_idx.numel() and (int(keep_idx.min()) < 0 or int(keep_idx.max()) >= num_patches):
        raise ConfigError(f"keep_idx values must index patches in [0, {num_patches})")
    return keep_idx.long()


def embed_tokens(
    patch_embed: PatchEmbed,
    cls_token: torch.Tensor,
    pos_embed: torch.Tensor,
    pos_drop: nn.Module,
    x: torch.Tensor,
    keep_idx: torch.Tensor | None = None,
    reg_token: torch.Tensor | None = None,
) -> torch.Tensor:
    """Images -> (B, 1+R+K, D) tokens: class token, the R register tokens (if
    any), then the kept patches.

    Position embeddings are added to every patch *before* the gather, so each
    kept token carries its own position (SMI, EFTViT); registers get none (as in
    DINOv2). ``keep_idx=None`` keeps all patches in order (identical to timm's
    dense path).
    """
    x = patch_embed(x) + pos_embed[:, 1:]
    if keep_idx is not None:
        idx = _check_keep_idx(keep_idx, x.shape[0], x.shape[1])
        x = torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    b = x.shape[0]
    prefix = [(cls_token + pos_embed[:, :1]).expand(b, -1, -1)]
    if reg_token is not None:
        prefix.append(reg_token.expand(b, -1, -1))
    return pos_drop(torch.cat([*prefix, x], dim=1))


def pool_tokens(
    tokens: torch.Tensor, global_pool: str, fc_norm: nn.Module, num_prefix: int = 1
) -> torch.Tensor:
    """(B, P+K, D) normalised tokens -> (B, D) pooled feature; ``num_prefix`` is
    P = 1 + the number of register tokens."""
    return fc_norm(_POOLS[global_pool](tokens, num_prefix))


class ViTBottom(nn.Module):
    """Patch embedding + position + the first ``m`` blocks: images -> tokens.

    Shares its parameters with the model it was split from (EFTViT clients
    train only these).
    """

    def __init__(self, vit: VisionTransformer, m: int):
        super().__init__()
        self.patch_embed = vit.patch_embed
        self.cls_token = vit.cls_token
        self.reg_token = vit.reg_token
        self.pos_embed = vit.pos_embed
        self.pos_drop = vit.pos_drop
        self.blocks = vit.blocks[:m]
        self.num_prefix_tokens = vit.num_prefix_tokens

    def forward(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        x = embed_tokens(
            self.patch_embed,
            self.cls_token,
            self.pos_embed,
            self.pos_drop,
            x,
            keep_idx,
            self.reg_token,
        )
        return self.blocks(x)


class ViTTop(nn.Module):
    """The remaining blocks + final norm + pooling + head: tokens -> logits.

    Accepts any number of tokens (class token, then registers, first), so it
    runs on the sparse token sets a bottom produced. Its ``state_dict`` keys
    equal the full model's (``blocks.{i}`` keep their original index).
    """

    def __init__(self, vit: VisionTransformer, m: int):
        super().__init__()
        self.blocks = vit.blocks[m:]
        self.norm = vit.norm
        self.fc_norm = vit.fc_norm
        self.head_drop = vit.head_drop
        self.head = vit.head
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens

    def forward_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(tokens))

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        return pool_tokens(
            self.forward_tokens(tokens), self.global_pool, self.fc_norm, self.num_prefix_tokens
        )

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_drop(f))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(tokens))


class ViTEncoder(nn.Module):
    """Images -> pooled (B, D) feature; the model minus its head (shared parameters)."""

    def __init__(self, vit: VisionTransformer):
        super().__init__()
        self.bottom = ViTBottom(vit, len(vit.blocks))
        self.norm = vit.norm
        self.fc_norm = vit.fc_norm
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens

    def forward(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        tokens = self.norm(self.bottom(x, keep_idx))
        return pool_tokens(tokens, self.global_pool, self.fc_norm, self.num_prefix_tokens)


class VisionTransformer(ImageClassifier):
    """ViT / DeiT (non-distilled) / DINOv2 with timm's parameter names.

    ``global_pool="token"`` (class token, the ViT/DeiT default) or ``"avg"``
    (mean of patch tokens; then, as in timm, ``norm`` is the identity and
    ``fc_norm`` normalises the pooled feature). ``init_values`` turns on layer
    scale (``ls1/ls2.gamma``; DINOv2 uses 1e-5), ``reg_tokens`` adds that many
    register tokens (``reg_token``, (1, R, D); DINOv2-reg uses 4).
    """

    classifier_name = "head"

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        reg_tokens: int = 0,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        act: str = "gelu",
    ):
        super().__init__()
        for arg, v in (
            ("in_chans", in_chans),
            ("num_classes", num_classes),
            ("embed_dim", embed_dim),
            ("depth", depth),
            ("num_heads", num_heads),
            ("patch_size", patch_size),
        ):
            check_positive(arg, v)
        if isinstance(reg_tokens, bool) or not isinstance(reg_tokens, int) or reg_tokens < 0:
            raise ConfigError(f"reg_tokens must be a non-negative integer, got {reg_tokens!r}")
        if global_pool not in _POOLS:
            raise ConfigError(
                f"global_pool {global_pool!r} unknown; valid: {', '.join(sorted(_POOLS))}"
            )
        act_layer = get_act_layer(act)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.embed_dim = embed_dim
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = 1 + reg_tokens
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)
        dpr = torch.linspace(
            0, drop_path_rate, depth, device="cpu"
        ).tolist()  # stochastic depth decay rule
        block_kw = dict(
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            init_values=init_values,
            drop=drop_rate,
            attn_drop=attn_drop_rate,
            act_layer=act_layer,
        )
        self.blocks = nn.Sequential(
            *[Block(embed_dim, drop_path=dpr[i], **block_kw) for i in range(depth)]
        )
        use_fc_norm = global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else LayerNorm(embed_dim)
        self.fc_norm = LayerNorm(embed_dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """timm's default ('') scheme: trunc-normal(0.02) positions and linears,
        tiny-normal class token, zero biases."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters that optimizers should not decay (timm convention)."""
        return {"pos_embed", "cls_token", "reg_token"}

    @property
    def num_patches(self) -> int:
        return self.patch_embed.num_patches

    # --- dense / sparse forward ------------------------------------------
    def embed(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        """Images -> (B, 1+R+K, D) input tokens (class token, registers, patches)."""
        return embed_tokens(
            self.patch_embed,
            self.cls_token,
            self.pos_embed,
            self.pos_drop,
            x,
            keep_idx,
            self.reg_token,
        )

    def forward_tokens(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        """Images -> (B, 1+R+K, D) output tokens after the final norm."""
        return self.norm(self.blocks(self.embed(x, keep_idx)))

    def forward_features(
        self, x: torch.Tensor, keep_idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        return pool_tokens(
            self.forward_tokens(x, keep_idx), self.global_pool, self.fc_norm, self.num_prefix_tokens
        )

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_drop(f))

    def forward(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, keep_idx))

    def token_logits(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        """The head on the class token and every kept patch token: (B, 1+K,
        num_classes), class token first; register tokens are left out (they
        stand for no image region).

        With ``global_pool="token"`` row 0 equals :meth:`forward`'s logits.
        """
        t = self.forward_tokens(x, keep_idx)
        t = torch.cat([t[:, :1], t[:, self.num_prefix_tokens :]], dim=1)
        return self.head(self.head_drop(self.fc_norm(t)))

    # --- attention, split, encoder ---------------------------------------
    def attention_maps(
        self,
        x: torch.Tensor,
        block: int = -1,
        average_heads: bool = True,
        keep_idx: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Class-token-to-patch attention of block ``block``: (B, K) averaged over
        heads, or (B, H, K). Columns follow the (kept) patch order; each row sums
        to 1 minus the class token's attention to itself and to the registers.
        Only the blocks up to ``block`` run."""
        depth = len(self.blocks)
        if not -depth <= block < depth:
            raise ConfigError(f"block {block} out of range for a {depth}-block ViT")
        b = block % depth
        t = self.blocks[:b](self.embed(x, keep_idx))
        blk = self.blocks[b]
        attn = blk.attn.attention_weights(blk.norm1(t))[:, :, 0, self.num_prefix_tokens :]
        return attn.mean(dim=1) if average_heads else attn

    def split(self, m: int) -> tuple[ViTBottom, ViTTop]:
        """(bottom, top) with ``top(bottom(x, keep_idx)) == forward(x, keep_idx)``;
        bottom holds the embedding and blocks ``[0, m)``, top the rest.

        The halves hold the model's current modules: split *after*
        :func:`~osfl.models.load_pretrained` / ``reset_classifier``."""
        depth = len(self.blocks)
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= depth:
            raise ConfigError(f"split point m must be an integer in [0, {depth}], got {m!r}")
        return ViTBottom(self, m), ViTTop(self, m)

    def feature_extractor(self) -> ViTEncoder:
        return ViTEncoder(self)


def random_keep_idx(
    batch: int,
    num_patches: int,
    num_keep: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Per-sample random subsets of ``num_keep`` patch indices, sorted (B, K).

    EFTViT masks 75 % of patches at random per image; sorting keeps the
    original token order, which attention does not need but makes results
    reproducible and comparable to the dense path.
    """
    if not 1 <= num_keep <= num_patches:
        raise ConfigError(f"num_keep must lie in [1, {num_patches}], got {num_keep}")
    noise = torch.rand(batch, num_patches, generator=generator, device=device)
    return noise.argsort(dim=1)[:, :num_keep].sort(dim=1).values


def _create_vit(defaults: dict[str, Any], **kwargs: Any) -> VisionTransformer:
    """Private builder: registered constructors only set hyper-parameters; the
    caller's keyword arguments (``img_size``, ``depth``, ...) override them."""
    return VisionTransformer(**{**defaults, **kwargs})


# --- registered constructors: hyper-parameters only (timm's values) ---------
@register_model
def vit_tiny_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=192, depth=12, num_heads=3), **kwargs)


@register_model
def vit_small_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=384, depth=12, num_heads=6), **kwargs)


@register_model
def vit_base_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=768, depth=12, num_heads=12), **kwargs)


@register_model
def deit_tiny_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=192, depth=12, num_heads=3), **kwargs)


@register_model
def deit_small_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=384, depth=12, num_heads=6), **kwargs)


@register_model
def deit_base_patch16_224(**kwargs: Any) -> VisionTransformer:
    return _create_vit(dict(patch_size=16, embed_dim=768, depth=12, num_heads=12), **kwargs)


@register_model
def vit_tiny_patch4_32(**kwargs: Any) -> VisionTransformer:
    """CIFAR-sized ViT-Ti: 8×8 grid of 4-px patches (65 tokens)."""
    cfg = dict(img_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3, num_classes=10)
    return _create_vit(cfg, **kwargs)


@register_model
def vit_small_patch4_32(**kwargs: Any) -> VisionTransformer:
    """CIFAR-sized ViT-S: 8×8 grid of 4-px patches."""
    cfg = dict(img_size=32, patch_size=4, embed_dim=384, depth=12, num_heads=6, num_classes=10)
    return _create_vit(cfg, **kwargs)


@register_model
def vit_tiny_patch2_16(**kwargs: Any) -> VisionTransformer:
    """Digit-sized ViT-Ti: 16 px, 8×8 grid of 2-px patches (pass ``in_chans=1`` for grey)."""
    cfg = dict(img_size=16, patch_size=2, embed_dim=192, depth=12, num_heads=3, num_classes=10)
    return _create_vit(cfg, **kwargs)


# --- DINOv2 (timm's vit_*_patch14_dinov2 / vit_*_patch14_reg4_dinov2 hyper-parameters) ---
# 518 px = the 37x37 grid the checkpoints were trained at; pass img_size=224 (or
# any multiple of 14) and load_pretrained resamples the position embeddings.
_DINOV2 = dict(img_size=518, patch_size=14, init_values=1e-5)


@register_model
def dinov2_small(**kwargs: Any) -> VisionTransformer:
    """DINOv2 ViT-S/14 (facebook/dinov2-small, timm vit_small_patch14_dinov2)."""
    return _create_vit(dict(_DINOV2, embed_dim=384, depth=12, num_heads=6), **kwargs)


@register_model
def dinov2_base(**kwargs: Any) -> VisionTransformer:
    """DINOv2 ViT-B/14 (facebook/dinov2-base, timm vit_base_patch14_dinov2)."""
    return _create_vit(dict(_DINOV2, embed_dim=768, depth=12, num_heads=12), **kwargs)


@register_model
def dinov2_large(**kwargs: Any) -> VisionTransformer:
    """DINOv2 ViT-L/14 (facebook/dinov2-large, timm vit_large_patch14_dinov2)."""
    return _create_vit(dict(_DINOV2, embed_dim=1024, depth=24, num_heads=16), **kwargs)


@register_model
def dinov2_small_reg(**kwargs: Any) -> VisionTransformer:
    """DINOv2 ViT-S/14 with 4 registers (facebook/dinov2-with-registers-small)."""
    cfg = dict(_DINOV2, embed_dim=384, depth=12, num_heads=6, reg_tokens=4)
    return _create_vit(cfg, **kwargs)


@register_model
def dinov2_base_reg(**kwargs: Any) -> VisionTransformer:
    """DINOv2 ViT-B/14 with 4 registers (facebook/dinov2-with-registers-base)."""
    cfg = dict(_DINOV2, embed_dim=768, depth=12, num_heads=12, reg_tokens=4)
    return _create_vit(cfg, **kwargs)
