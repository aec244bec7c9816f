"""FuseFL roles in a fused block: member m's block sits behind member m's own
adaptor, and the parameter-free adaptor is the members' mean.

Client m trains its adaptor together with its block (``StepModel``); the
fused block must keep that pairing. The adaptors and blocks here are hand
made and distinguishable (each adaptor reads a different stream at a
different scale, each block scales differently), so the expected outputs
are computed by hand and any exchanged pairing or a sum in place of the mean
fails.
"""

from __future__ import annotations

import torch
from torch import nn

from osfl.methods.fusefl.modules import Conv1x1Adaptor, FusedBlock, MeanAdaptor


class Pick(nn.Module):
    """An adaptor that reads stream ``i`` of the members' features, times ``scale``."""

    def __init__(self, i: int, scale: float):
        super().__init__()
        self.i, self.scale = i, scale

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.scale * xs[self.i]


class Affine(nn.Module):
    """A block computing ``a * x + b``."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x + self.b


def test_each_member_block_reads_through_its_own_adaptor() -> None:
    """Streams u = 1, v = 2; member 0: adaptor 3·u, block 2x + 1 -> 7;
    member 1: adaptor 10·v, block -x -> -20 (exchanged: 41 and -3)."""
    block = FusedBlock([0, 1], [Affine(2.0, 1.0), Affine(-1.0, 0.0)], [Pick(0, 3.0), Pick(1, 10.0)])
    u, v = torch.ones(1, 1, 2, 2), torch.full((1, 1, 2, 2), 2.0)
    out = block([u, v])
    assert [float(o.flatten()[0]) for o in out] == [7.0, -20.0]
    assert all(torch.equal(o, o.flatten()[0].expand_as(o)) for o in out)


def test_the_first_block_reads_the_image_with_every_member() -> None:
    block = FusedBlock([3, 5], [Affine(2.0, 0.0), Affine(0.0, 4.0)], [])
    x = torch.full((1, 1, 2, 2), 1.5)
    assert [float(o.flatten()[0]) for o in block(x)] == [3.0, 4.0]


def test_the_mean_adaptor_averages_the_streams() -> None:
    """The parameter-free adaptor: (u + v + w) / 3 = (1 + 2 + 6) / 3 = 3."""
    xs = [torch.full((1, 2, 1, 1), c) for c in (1.0, 2.0, 6.0)]
    torch.testing.assert_close(MeanAdaptor(3, 2)(xs), torch.full((1, 2, 1, 1), 3.0))


def test_the_conv_adaptor_concatenates_members_in_order() -> None:
    """A 1×1 conv over M·C = 2·1 channels whose weight (1, -10) and bias 0.5
    give u - 10 v + 0.5 = 1 - 20 + 0.5 = -18.5 on streams u = 1, v = 2."""
    a = Conv1x1Adaptor(2, 1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        a.conv.weight.copy_(torch.tensor([1.0, -10.0]).view(1, 2, 1, 1))
        a.conv.bias.fill_(0.5)
    u, v = torch.ones(1, 1, 2, 2), torch.full((1, 1, 2, 2), 2.0)
    torch.testing.assert_close(a([u, v]), torch.full((1, 1, 2, 2), -18.5))
