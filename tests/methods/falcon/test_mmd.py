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


def test_the_bandwidth_enters_squared_and_a_zero_bandwidth_is_floored() -> None:
    """k(a, b) = exp(−‖a − b‖² / (2σ²)) at σ = 2 (σ² = 4, not σ³ = 8), and σ
    = 0 (identical points: median distance 0) is floored at 1e-12, not at 1."""
    x = torch.tensor([[0.0], [1.0]])
    y = torch.tensor([[3.0], [4.0]])
    k = lambda a, b: math.exp(-((a - b) ** 2) / 8.0)  # noqa: E731  (σ = 2)
    expect = (k(0, 1) + k(3, 4)) - 2 * (k(0, 3) + k(0, 4) + k(1, 3) + k(1, 4)) / 4
    assert mmd2(x, y, bandwidth=2.0) == pytest.approx(expect, rel=1e-9)
    # σ = 1e-6: every distinct pair's kernel is 0, only the (dropped) diagonals are 1
    tiny = mmd2(x, y, bandwidth=1e-6, unbiased=False)
    assert tiny == pytest.approx(0.5 + 0.5, abs=1e-12)  # mean(kxx) + mean(kyy), kxy = 0
    assert mmd2(x, y, bandwidth=0.0, unbiased=False) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match=r"^mmd2 needs at least two samples on each side$"):
        mmd2(x, y[:1])


def test_median_bandwidth_of_one_point_each_is_their_distance_and_of_nothing_one() -> None:
    assert median_bandwidth(torch.tensor([[0.0]]), torch.tensor([[3.0]])) == pytest.approx(3.0)
    empty = torch.zeros(0, 2)
    assert median_bandwidth(empty, empty) == 1.0  # no pair: the kernel's unit scale
