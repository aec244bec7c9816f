"""Parameter-efficient federated fine-tuning of ViTs: the baselines of EFTViT
(Table 1) and the small PEFT modules they are built from. See docs/methods/peft.md.

- modules that wrap a built ViT without renaming its frozen parameters (so
  pretrained checkpoints load unchanged): LoRA (:mod:`.lora`, including the q/v
  slices of a fused qkv) and VPT-shallow prompts (:mod:`.prompts`);
- :mod:`.base`: FedAvg over a trainable subset (``PEFTMethod``), the frozen
  base every party builds, per-tensor averaging over the clients that hold it;
- registered methods: ``fedfull``, ``fedhead``, ``fedbias``, ``fedprompt``,
  ``fedlora`` (:mod:`.methods`), ``fedra`` (:mod:`.fedra`), ``fedbfpt``
  (:mod:`.fedbfpt`, a ViT port);
- :mod:`.flops`: forward GFLOPs per image and trainable-parameter counts
  (the per-round client costs every method reports).
"""

from osfl.methods.peft.base import FrozenBase, PEFTConfig, PEFTMethod, SubsetViT, holder_average
from osfl.methods.peft.fedbfpt import FedBFPT, FedBFPTConfig, bfpt_stage
from osfl.methods.peft.fedra import FedRA, FedRAConfig, random_allocation
from osfl.methods.peft.flops import forward_gflops, trainable_parameters
from osfl.methods.peft.lora import (
    LoRALinear,
    SeededDropout,
    add_lora,
    merge_lora,
    reset_lora,
    set_dropout_generator,
)
from osfl.methods.peft.methods import (
    FedBias,
    FedFull,
    FedHead,
    FedLoRA,
    FedLoRAConfig,
    FedPrompt,
    FedPromptConfig,
    LoRAConfig,
)
from osfl.methods.peft.prompts import add_prompt_tokens, reset_prompts

__all__ = [
    "FedBFPT",
    "FedBFPTConfig",
    "FedBias",
    "FedFull",
    "FedHead",
    "FedLoRA",
    "FedLoRAConfig",
    "FedPrompt",
    "FedPromptConfig",
    "FedRA",
    "FedRAConfig",
    "FrozenBase",
    "LoRAConfig",
    "LoRALinear",
    "PEFTConfig",
    "PEFTMethod",
    "SeededDropout",
    "SubsetViT",
    "add_lora",
    "add_prompt_tokens",
    "bfpt_stage",
    "forward_gflops",
    "holder_average",
    "merge_lora",
    "random_allocation",
    "reset_lora",
    "reset_prompts",
    "set_dropout_generator",
    "trainable_parameters",
]
