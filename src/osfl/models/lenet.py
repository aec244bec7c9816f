"""LeNet-5.

LeCun et al., "Gradient-based learning applied to document recognition"
(Proc. IEEE 1998), in its common modern form (as in the PyTorch CIFAR tutorial
and the label-recovery literature): conv 5×5 -> 6, 2×2 max-pool, conv 5×5 ->
16, 2×2 max-pool, fc 120, fc 84, fc K. The feature is the 84-d vector before
the last linear layer (which ``get_classifier`` returns).

The flatten size is computed from ``img_size`` (16·5·5 at the classic 32 px);
an adaptive average pool to that grid makes other input sizes (≥ 16 px) work
and is the identity at ``img_size``. The smallest input is 16 px (12 px would
leave a 4×4 map for the second 5×5 conv).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.models.layers import TrunkClassifier, check_positive, make_act
from osfl.models.registry import register_model

_MIN_SIZE = 16  # two 5×5 valid convs and two 2×2 pools leave 1×1 at 16 px


def _lenet_grid(img_size: int) -> int:
    return ((img_size - 4) // 2 - 4) // 2


class LeNet5(TrunkClassifier):
    """LeNet-5: ``features`` (convs + fc1/fc2, 84-d output) then ``fc3``."""

    classifier_name = "fc3"
    trunk_names = ("features",)

    def __init__(
        self, num_classes: int = 10, in_chans: int = 3, img_size: int = 32, act: str = "relu"
    ):
        super().__init__()
        check_positive("num_classes", num_classes)
        check_positive("in_chans", in_chans)
        if check_positive("img_size", img_size) < _MIN_SIZE:
            raise ConfigError(
                f"lenet5 needs img_size >= {_MIN_SIZE}, got {img_size}; upsample the images"
            )
        self.num_classes = num_classes
        g = _lenet_grid(img_size)
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(in_chans, 6, 5),
                act1=make_act(act),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(6, 16, 5),
                act2=make_act(act),
                pool2=nn.MaxPool2d(2),
                resize=nn.AdaptiveAvgPool2d(g),
                flatten=nn.Flatten(1),
                fc1=nn.Linear(16 * g * g, 120),
                act3=make_act(act),
                fc2=nn.Linear(120, 84),
                act4=make_act(act),
            )
        )
        self.num_features = 84
        self.fc3 = nn.Linear(84, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < _MIN_SIZE:
            raise ConfigError(
                f"lenet5 needs images of at least {_MIN_SIZE} px, got {tuple(x.shape[-2:])}"
            )
        return self.features(x)


@register_model
def lenet5(**kwargs: Any) -> LeNet5:
    """Classic 32-px LeNet-5 (6/16 convs, 120/84 fcs)."""
    return LeNet5(**kwargs)
