"""FuseFL's modules: adaptors, fused blocks, a client's step model, the predictor.

A *fused block* j holds, for every client m whose block j the server
accepted, client m's adaptor (none for j = 0) and its block j. Its input is
the previous fused block's outputs (one feature map per member); member m
maps their channel-wise concatenation back to the width its block expects
with its adaptor, then applies its block. So the fused model is M parallel
streams that read each other's features at every cut (the paper's Fig. 4d),
and it costs about M single models per image.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from osfl.fl.method import Predictor
from osfl.registry import Registry

__all__ = [
    "ADAPTORS",
    "ClassifierFusion",
    "FuseFLPredictor",
    "FusedBlock",
    "FusedTrunk",
    "StepModel",
]

Features = list[torch.Tensor]


class Conv1x1Adaptor(nn.Module):
    """The paper's adaptor: a 1×1 conv from the M concatenated feature maps
    (M·C channels) to the C channels the next block expects (the code's
    ``cnn1x1``)."""

    def __init__(self, members: int, channels: int, generator: torch.Generator | None = None):
        super().__init__()
        # built on meta and initialised from ``generator``: a client never draws
        # from the global torch RNG (thread-parallel clients stay deterministic)
        conv = nn.Conv2d(members * channels, channels, 1, device="meta").to_empty(device="cpu")
        fan_in = members * channels
        with torch.no_grad():  # PyTorch's default Conv2d init, from the given generator
            nn.init.kaiming_uniform_(conv.weight, a=math.sqrt(5), generator=generator)
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(conv.bias, -bound, bound, generator=generator)
        self.conv = conv

    def forward(self, xs: Features) -> torch.Tensor:
        return self.conv(torch.cat(xs, dim=1))


class MeanAdaptor(nn.Module):
    """The parameter-free alternative (the paper's "simple average", the code's ``avg``)."""

    def __init__(self, members: int, channels: int, generator: torch.Generator | None = None):
        super().__init__()

    def forward(self, xs: Features) -> torch.Tensor:
        return torch.stack(xs).mean(dim=0)


AdaptorFactory = Callable[[int, int, torch.Generator | None], nn.Module]
#: Adaptor name -> ``factory(members, channels, generator)``.
ADAPTORS: Registry[AdaptorFactory] = Registry("FuseFL adaptor")
ADAPTORS.add("conv1x1", Conv1x1Adaptor)
ADAPTORS.add("avg", MeanAdaptor)


class FusedBlock(nn.Module):
    """Block j of every member, each behind its own adaptor (``adaptors`` is
    empty for the first block, whose input is the image)."""

    def __init__(
        self, members: Sequence[int], blocks: Sequence[nn.Module], adaptors: Sequence[nn.Module]
    ):
        super().__init__()
        self.members = list(members)
        self.blocks = nn.ModuleList(blocks)
        self.adaptors = nn.ModuleList(adaptors)

    def forward(self, x: torch.Tensor | Features) -> Features:
        if not len(self.adaptors):
            return [b(x) for b in self.blocks]
        return [b(a(x)) for a, b in zip(self.adaptors, self.blocks, strict=True)]


class FusedTrunk(nn.Module):
    """Fused blocks 0..j-1 in turn: image -> the last one's member features."""

    def __init__(self, blocks: Sequence[FusedBlock]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> Features:
        out: torch.Tensor | Features = x
        for block in self.blocks:
            out = block(out)
        return out  # type: ignore[return-value]


class StepModel(nn.Module):
    """What client m trains in step k >= 1: the frozen fused blocks 0..k-1,
    then its new adaptor, its own blocks k..K-1 and its classifier.

    ``train()`` keeps the fused prefix in eval mode: its BatchNorm statistics
    are the other clients' and must not drift towards this client's data."""

    def __init__(
        self, prefix: FusedTrunk, adaptor: nn.Module, own: Sequence[nn.Module], head: nn.Module
    ):
        super().__init__()
        self.prefix = prefix.requires_grad_(False)
        self.adaptor = adaptor
        self.own = nn.ModuleList(own)
        self.head = head

    def train(self, mode: bool = True) -> StepModel:
        super().train(mode)
        self.prefix.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            feats = self.prefix(x)
        z = self.adaptor(feats)
        for block in self.own:
            z = block(z)
        return self.head(z)


class ClassifierFusion(nn.Module):
    """The final classifier over the last fused block's member features.

    ``average`` (the code's ``fedexnn_classifer=avg``): one linear layer, the
    members' classifiers averaged by data size, applied to the members'
    mean feature. ``heads``: each member's own classifier on its own feature,
    logits averaged (what each classifier was trained on)."""

    def __init__(self, heads: Sequence[nn.Linear], weights: Sequence[float], mode: str):
        super().__init__()
        self.mode = mode
        if mode == "average":
            w = torch.tensor(list(weights), dtype=torch.float32)
            avg = nn.Linear(heads[0].in_features, heads[0].out_features)
            with torch.no_grad():
                avg.weight.copy_(sum(wi * h.weight for wi, h in zip(w, heads, strict=True)))
                avg.bias.copy_(sum(wi * h.bias for wi, h in zip(w, heads, strict=True)))
            self.heads = nn.ModuleList([avg])
        else:
            self.heads = nn.ModuleList(heads)

    def forward(self, feats: Features) -> torch.Tensor:
        if self.mode == "average":
            return self.heads[0](torch.stack(feats).mean(dim=0))
        return torch.stack([h(f) for h, f in zip(self.heads, feats, strict=True)]).mean(dim=0)


class FuseFLPredictor(Predictor):
    """The fused model: K fused blocks, then the fused classifier."""

    def __init__(self, trunk: FusedTrunk, classifier: ClassifierFusion):
        super().__init__()
        self.trunk = trunk
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.trunk(x))
