"""The parameter-efficient FedAvg baselines of EFTViT (Table 1), each a
:class:`~osfl.methods.peft.base.PEFTMethod` that names its trainable set:

- ``fedfull`` (Fed-Full): every parameter, i.e. multi-round FedAvg of the
  whole ViT [McMahan et al., AISTATS 2017] — EFTViT's unconstrained reference;
- ``fedhead`` (Fed-Head): the classification head only (linear probing);
- ``fedbias`` (Fed-Bias): BitFit [Ben Zaken, Ravfogel & Goldberg, "BitFit:
  Simple Parameter-efficient Fine-tuning for Transformer-based Masked
  Language-models", ACL 2022]: every bias term (linear and LayerNorm) + head;
- ``fedprompt`` (Fed-Prompt): VPT-shallow [Jia et al., "Visual Prompt
  Tuning", ECCV 2022, Eq. 5]: learnable prompt tokens after the class token
  (:mod:`osfl.methods.peft.prompts`) + head;
- ``fedlora`` (Fed-LoRA): LoRA [Hu et al., ICLR 2022, §4.2/§7.1] on the query
  and value projections of every block (the q and v slices of timm's fused
  ``attn.qkv``), rank 8, alpha 8 + head (:mod:`osfl.methods.peft.lora`).

All aggregate the trainable tensors with FedAvg (EFTViT §4.3: "These methods
use FedAVG for parameter aggregation"); the frozen rest is the common
pretrained model and never crosses the network.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.methods.peft.base import PEFTConfig, PEFTMethod, peft_smoke
from osfl.methods.peft.lora import add_lora, reset_lora
from osfl.methods.peft.prompts import PROMPT_KEY, add_prompt_tokens, reset_prompts

LORA_MARK = ".lora_"


@register_method("fedfull")
class FedFull(PEFTMethod):
    """Fed-Full: FedAvg over every parameter."""

    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary="Multi-round FedAvg of every parameter of a pretrained ViT (full fine-tuning).",
        paper=(
            'McMahan et al., AISTATS 2017, as Fed-Full in "EFTViT: Efficient Federated Training '
            'of Vision Transformers with Masked Images on Resource-Constrained Clients", Table 1'
        ),
        smoke=peft_smoke("fedfull"),
    )

    def is_trainable(self, name: str) -> bool:
        return True


@register_method("fedhead")
class FedHead(PEFTMethod):
    """Fed-Head: only the classifier trains."""

    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Multi-round FedAvg of only the classifier head of a pretrained ViT (federated linear "
            "probing)."
        ),
        paper=(
            'Fed-Head in "EFTViT: Efficient Federated Training of Vision Transformers with Masked '
            'Images on Resource-Constrained Clients", Table 1'
        ),
        smoke=peft_smoke("fedhead", "train.lr=0.01"),
    )

    def is_trainable(self, name: str) -> bool:
        return name.startswith(self.head_prefix())


@register_method("fedbias")
class FedBias(PEFTMethod):
    """Fed-Bias (BitFit): every bias term + the classifier."""

    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Multi-round FedAvg of a pretrained ViT's bias terms and classifier head (BitFit)."
        ),
        paper=(
            'Ben Zaken et al., "BitFit: Simple Parameter-efficient Fine-tuning for '
            'Transformer-based Masked Language-models", ACL 2022 (Fed-Bias in EFTViT, Table 1)'
        ),
        smoke=peft_smoke("fedbias"),
    )

    def is_trainable(self, name: str) -> bool:
        return name.endswith(".bias") or name.startswith(self.head_prefix())


@dataclass(frozen=True)
class FedPromptConfig(PEFTConfig):
    """``num_prompts``: VPT-shallow prompt tokens. 10 matches EFTViT Table 3
    (12.646 vs 12.005 GFLOPs: ~10 more tokens than ViT-B/16's 197)."""

    #: learnable prompt tokens prepended to the patch tokens
    num_prompts: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_prompts < 1:
            raise ConfigError(f"num_prompts must be >= 1, got {self.num_prompts}")


@register_method("fedprompt")
class FedPrompt(PEFTMethod):
    """Fed-Prompt (VPT-shallow): prompt tokens + the classifier."""

    Config: ClassVar[type] = FedPromptConfig
    needs_vit: ClassVar[bool] = True
    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Multi-round FedAvg of learnable prompt tokens and the head of a frozen pretrained "
            "ViT (VPT)."
        ),
        paper='Jia et al., "Visual Prompt Tuning", ECCV 2022 (Fed-Prompt in EFTViT, Table 1)',
        smoke=peft_smoke("fedprompt", "train.lr=0.01"),
    )

    def adapt(self, model: nn.Module) -> None:
        add_prompt_tokens(model, self.config.num_prompts)  # type: ignore[arg-type]

    def reset_adapters(self, model: nn.Module, generator: torch.Generator) -> None:
        reset_prompts(model, generator)  # type: ignore[arg-type]

    def is_trainable(self, name: str) -> bool:
        return name == PROMPT_KEY or name.startswith(self.head_prefix())


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA's rank r, scale alpha (the update is scaled by alpha/r) and input dropout."""

    #: rank r of each LoRA update
    rank: int = 8
    #: LoRA scale alpha (the update is scaled by alpha / r)
    alpha: float = 8.0
    #: dropout on the LoRA input
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"lora.rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout must lie in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class FedLoRAConfig(PEFTConfig):
    """LoRA on q and v, rank 8, alpha 8 (EFTViT §4.3; rank "≈ 8" per our note)."""

    #: the LoRA adapters
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@register_method("fedlora")
class FedLoRA(PEFTMethod):
    """Fed-LoRA: LoRA on the q and v slices of every ``attn.qkv`` + the classifier."""

    Config: ClassVar[type] = FedLoRAConfig
    needs_vit: ClassVar[bool] = True
    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Multi-round FedAvg of LoRA adapters on a frozen pretrained ViT's attention, plus the "
            "classifier head."
        ),
        paper=(
            'Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022 (Fed-LoRA '
            "in EFTViT, Table 1)"
        ),
        smoke=peft_smoke("fedlora"),
    )

    def adapt(self, model: nn.Module) -> None:
        lo = self.config.lora
        add_lora(
            model, ["attn.qkv"], lo.rank, lo.alpha, dropout=lo.dropout, chunks=3, slices=(0, 2)
        )

    def reset_adapters(self, model: nn.Module, generator: torch.Generator) -> None:
        reset_lora(model, generator)

    def is_trainable(self, name: str) -> bool:
        return LORA_MARK in name or name.startswith(self.head_prefix())
