"""Visual prompt tuning, shallow variant (VPT-shallow).

Jia et al., "Visual Prompt Tuning", ECCV 2022 (§3.2, Eq. 5): ``p`` learnable
prompt tokens are inserted into the first Transformer layer's input only,
between the class token and the patch embeddings,
``[x_1, Z_1, E_1] = L_1([x_0, P, E_0])``, without position embeddings; the
class token's output feeds the head. Prompts are initialised uniformly in
``±sqrt(6 / (3·patch² + D))`` (xavier over the patch-projection fan, the
public code's ``val``).

That is exactly how the osfl ViT places *register tokens* (Darcet et al.,
ICLR 2024): a (1, R, D) parameter ``reg_token`` after the class token, no
position embedding, left out of pooling and of ``token_logits``. So
:func:`add_prompt_tokens` gives a built ViT ``p`` registers and lets them
train; the frozen parameters keep their names and pretrained checkpoints
load unchanged. A model that already has registers (DINOv2-reg) is refused:
its registers are pretrained, not prompts.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.models.vit import VisionTransformer

PROMPT_KEY = "reg_token"


def add_prompt_tokens(vit: VisionTransformer, num_prompts: int) -> nn.Parameter:
    """Give ``vit`` ``num_prompts`` prompt tokens (zeros; see :func:`reset_prompts`)."""
    if not isinstance(vit, VisionTransformer):
        raise ConfigError(f"prompt tuning needs a ViT, got {type(vit).__name__}")
    if num_prompts < 1:
        raise ConfigError(f"num_prompts must be >= 1, got {num_prompts}")
    if vit.reg_token is not None:
        raise ConfigError(
            "this ViT already has register tokens (pretrained, e.g. DINOv2-reg); "
            "VPT-shallow prompts would replace them"
        )
    w = vit.cls_token
    vit.reg_token = nn.Parameter(
        torch.zeros(1, num_prompts, vit.embed_dim, device=w.device, dtype=w.dtype)
    )
    vit.num_reg_tokens = num_prompts
    vit.num_prefix_tokens = 1 + num_prompts
    return vit.reg_token


def reset_prompts(vit: VisionTransformer, generator: torch.Generator | None = None) -> None:
    """VPT's initialisation: U(±sqrt(6 / (3·patch² + D)))."""
    if vit.reg_token is None:
        raise ConfigError("the model has no prompt tokens (call add_prompt_tokens first)")
    ph, pw = vit.patch_embed.patch_size
    val = math.sqrt(6.0 / float(3 * ph * pw + vit.embed_dim))
    with torch.no_grad():
        vit.reg_token.uniform_(-val, val, generator=generator)
