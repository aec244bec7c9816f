"""EFTViT's cost figures, exactly: forward GFLOPs per image (2 per
multiply-add, attention included through the math backend) and trainable
parameters (tests that mutation testing showed were missing: TESTING.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.methods.peft.flops import forward_gflops, trainable_parameters


@pytest.mark.parametrize("batch", [1, 3])
def test_a_linear_layer_costs_two_flops_per_multiply_add_per_image(batch) -> None:
    layer = nn.Linear(10, 20, bias=False)
    assert forward_gflops(layer, torch.zeros(batch, 10)) == pytest.approx(
        2 * 10 * 20 / 1e9, rel=1e-12
    )


def test_an_empty_batch_is_not_divided_by_zero() -> None:
    assert forward_gflops(nn.Linear(10, 20), torch.zeros(0, 10)) == 0.0


def test_attention_is_counted_through_the_math_backend() -> None:
    """q kᵀ and (softmax) v: 2 · T · T · d each per head, per image."""
    t, d = 6, 8

    def attend(x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x)

    gflops = forward_gflops(attend, torch.zeros(2, 1, t, d))
    assert gflops == pytest.approx(2 * (2 * t * t * d) / 1e9, rel=1e-12)


def test_trainable_parameters_skip_frozen_and_count_shared_once() -> None:
    shared = nn.Linear(3, 4)
    model = nn.Sequential(shared, shared, nn.Linear(4, 2))
    model[2].weight.requires_grad_(False)
    assert trainable_parameters(model) == 3 * 4 + 4 + 2
