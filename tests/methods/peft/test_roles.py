"""PEFT roles: each LoRA slice's update lands on its own output chunk, in the
forward pass and in the merged weight alike.

Fed-LoRA adapts the q and v slices (chunks 0 and 2) of timm's fused
``attn.qkv``; adapter row s belongs to chunk ``slices[s]``. With distinct
hand-set A and B per slice, the expected update of every chunk is written
out here ((alpha/r) B_s A_s on q and v, nothing on k), so an update placed
on the other slice fails, in ``forward`` and in ``merged``/``delta_weight``.
A tensor only some clients trained is averaged over them with their own
weights.
"""

from __future__ import annotations

import torch
from torch import nn

from osfl.methods.peft import holder_average
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


def test_each_holder_s_tensor_is_weighted_by_its_own_client() -> None:
    """FedRA / FEDBFPT: a tensor is averaged over the clients that trained
    it, each with its own FedAvg weight renormalised among them
    (``holder_average``). Four clients of four different weights hold
    different subsets (the first client, the last, a middle pair, all), each
    tensor a different constant per client: the averages are worked out by
    hand by client id, so weights taken by position among all clients after
    the holders are selected give other numbers."""
    weights = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}
    held = {"a": (0,), "b": (3,), "c": (1, 2), "d": (0, 1, 2, 3), "e": (1, 3)}
    uploads = {
        c: {n: torch.full((2,), float(10 * c + i)) for i, n in enumerate(held) if c in held[n]}
        for c in weights
    }
    got = holder_average(uploads, weights)
    assert set(got) == set(held)
    for i, (name, holders) in enumerate(held.items()):
        total = sum(weights[c] for c in holders)
        want = sum(weights[c] * (10 * c + i) for c in holders) / total
        torch.testing.assert_close(got[name], torch.full((2,), want))
