"""Client-cost figures a method reports per round: forward GFLOPs per image
and trainable parameters (EFTViT Table 3 "GFLOPs", Table 4, Table 5 "Params").

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs
per multiply-add, matmuls and convolutions). Attention runs through
``scaled_dot_product_attention``, whose fused CPU kernel the counter does not
see; :func:`forward_gflops` therefore forces the math backend, which
decomposes into the batched matmuls the counter counts, so the attention
term (quadratic in the tokens kept) is included on every device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def forward_gflops(forward: Callable[[torch.Tensor], Any], x: torch.Tensor) -> float:
    """Forward GFLOPs per image of ``forward(x)`` (x: a batch of B images), no grad."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        forward(x)
    return counter.get_total_flops() / max(1, x.shape[0]) / 1e9


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with ``requires_grad`` (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
