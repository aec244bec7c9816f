"""The methods' shared tiny task: a one-block ViT on 16-px digits
(``support.tiny.TINY_VIT``; FedCGS, GH-OFL and the frozen-encoder mechanisms).
And ``data``: the 24 digits of the weight-averaging family's by-hand
examples (tests/methods/fedavg/, tests/methods/schemes/). A family's own ``tiny``
(its conftest.py or module) takes its place there."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.data.imageset import ImageSet
from osfl.data.sources import load_data
from support.tiny import TINY_VIT, load_tiny


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return load_tiny(TINY_VIT)


@pytest.fixture(scope="module")
def data() -> ImageSet:
    """24 digits at 16 px (the client of every hand example)."""
    train = load_data("digits", image_size=16, max_per_class=3).train
    return train.subset(torch.arange(24).numpy())
