"""PEFT roles: each LoRA slice's update lands on its own output chunk, in the
forward pass and in the merged weight alike.

Fed-LoRA adapts the q and v slices (chunks 0 and 2) of timm's fused
``attn.qkv``; adapter row s belongs to chunk ``slices[s]``. With distinct
hand-set A and B per slice, the expected update of every chunk is written
out here ((alpha/r) B_s A_s on q and v, nothing on k), so an update placed
on the other slice fails, in ``forward`` and in ``merged``/``delta_weight``.
"""

from __future__ import annotations

import torch
from torch import nn

from osfl.methods.peft.lora import LoRALinear


def qv_layer() -> LoRALinear:
    """in 2, out 3 chunks of 1; W0 = 0, bias 0; rank 1, alpha 2 (scaling 2):
    q's A = (1, 0), B = 3; v's A = (0, 1), B = -5."""
    base = nn.Linear(2, 3)
    with torch.no_grad():
        base.weight.zero_()
        base.bias.zero_()
    layer = LoRALinear(base, rank=1, alpha=2.0, chunks=3, slices=(0, 2))
    with torch.no_grad():
        layer.lora_A.copy_(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
        layer.lora_B.copy_(torch.tensor([[[3.0]], [[-5.0]]]))
    return layer


def test_each_slice_update_lands_on_its_own_chunk() -> None:
    """x = (1, 4): q = 2·3·1 = 6, k = 0, v = 2·(-5)·4 = -40."""
    layer = qv_layer()
    x = torch.tensor([[1.0, 4.0]])
    assert layer(x).tolist() == [[6.0, 0.0, -40.0]]
    assert layer.delta_weight().tolist() == [[6.0, 0.0], [0.0, 0.0], [0.0, -10.0]]
    merged = layer.merged()
    assert merged(x).tolist() == [[6.0, 0.0, -40.0]]
