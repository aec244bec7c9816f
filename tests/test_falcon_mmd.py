"""MMD between real and synthetic token sequences (FALCON Table 4's metric)."""

from __future__ import annotations

import math

import pytest
import torch

from osfl.methods.falcon import median_bandwidth, mmd2


def test_mmd_separates_distributions_and_is_zero_on_identical_samples() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, 4, generator=g)
    y = torch.randn(200, 5, 4, generator=g)
    shifted = y + 0.5
    same, far = mmd2(x, y), mmd2(x, shifted)
    assert abs(same) < 0.01 < far
    assert mmd2(x, x, unbiased=False) == pytest.approx(0.0, abs=1e-12)
    assert mmd2(x, y + 2.0) > far  # grows with the shift


def test_mmd_kernel_and_bandwidth() -> None:
    x = torch.tensor([[0.0], [1.0]])
    y = torch.tensor([[3.0], [4.0]])
    k = lambda a, b: math.exp(-((a - b) ** 2) / 2.0)  # noqa: E731  (σ = 1)
    expect = (k(0, 1) + k(3, 4)) - 2 * (k(0, 3) + k(0, 4) + k(1, 3) + k(1, 4)) / 4  # unbiased
    assert mmd2(x, y, bandwidth=1.0) == pytest.approx(expect, rel=1e-9)
    assert median_bandwidth(x, y) == pytest.approx(2.0)  # distances 1,3,4,2,3,1 -> median 2
    with pytest.raises(ValueError, match="two samples"):
        mmd2(x[:1], y)
