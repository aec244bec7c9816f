"""The KD family's input space, exactly: identity, channel fitting and the
uint8 pictures (tests that mutation testing showed were missing: TESTING.md)."""

from __future__ import annotations

import torch

from osfl.methods.kd.space import InputSpace


def test_identity_is_mean_zero_std_one_per_channel() -> None:
    assert InputSpace.identity(3) == InputSpace((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    x = torch.rand(2, 3, 4, 4)
    assert torch.equal(InputSpace.identity(3).normalize(x), x)


def test_to_uint8_rounds_the_denormalised_pixels_and_clamps_them() -> None:
    space = InputSpace((0.5,), (0.25,))  # pixel p is input (p - 0.5) / 0.25
    x = torch.tensor([-2.0, -1.0, 0.0, 0.01, 2.0, 3.0]).view(1, 1, 1, 6)
    # pixels 0, 0.25, 0.5, 0.5025, 1, 1.25 -> 0, 63.75, 127.5, 128.1, 255, (clamped) 255
    assert space.to_uint8(x).view(-1).tolist() == [0, 64, 128, 128, 255, 255]
    assert space.to_uint8(x).dtype == torch.uint8
    low = torch.tensor([-3.0]).view(1, 1, 1, 1)  # pixel -0.25: clamped to 0
    assert space.to_uint8(low).item() == 0


def test_with_channels_repeats_one_channel_or_keeps_the_first_ones() -> None:
    grey = InputSpace((0.5,), (0.25,))
    assert grey.with_channels(1) is grey
    assert grey.with_channels(3) == InputSpace((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    rgb = InputSpace((0.1, 0.2, 0.3), (1.0, 2.0, 3.0))
    assert rgb.with_channels(2) == InputSpace((0.1, 0.2), (1.0, 2.0))
