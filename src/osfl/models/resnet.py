"""ResNet-18 (BasicBlock) and ResNet-50 (Bottleneck), CIFAR and ImageNet stems.

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016). The
CIFAR variant (3×3 stride-1 stem, no max-pool; ``resnet18`` / ``resnet50``) is
the one FAFI's public code, DENSE and Co-Boosting train on 32×32 images
(kuangliu/pytorch-cifar layout). The ImageNet variant (``stem="imagenet"``:
7×7 stride-2 stem + 3×3 stride-2 max-pool; ``tv_resnet18`` / ``tv_resnet50``)
is torchvision's ``torchvision/models/resnet.py`` architecture exactly (ResNet
v1.5: the Bottleneck strides in its 3×3 conv), so torchvision and timm
``resnet18/50`` checkpoints load unchanged. Parameter names follow torchvision
(``conv1``, ``bn1``, ``layer{1-4}.{i}``, ``downsample.0/1``, ``fc``). ``act``
swaps every ReLU (e.g. ``"tanh"`` for the privacy audits that need smooth
activations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.models.layers import TrunkClassifier, check_positive, make_act
from osfl.models.registry import register_model
from osfl.registry import Registry


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _downsample(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


def _cifar_stem(in_chans: int, width: int) -> tuple[nn.Conv2d, nn.Module | None]:
    """3×3 stride-1 conv, no pooling: keeps 32×32 CIFAR maps at full resolution."""
    return _conv3x3(in_chans, width), None


def _imagenet_stem(in_chans: int, width: int) -> tuple[nn.Conv2d, nn.Module | None]:
    """torchvision's 7×7 stride-2 conv then 3×3 stride-2 max-pool (/4 overall)."""
    conv = nn.Conv2d(in_chans, width, 7, stride=2, padding=3, bias=False)
    return conv, nn.MaxPool2d(kernel_size=3, stride=2, padding=1)


#: Stem name -> builder of (``conv1``, ``maxpool`` or None).
STEMS: Registry[Callable[[int, int], tuple[nn.Conv2d, nn.Module | None]]] = Registry("resnet stem")
STEMS.add("cifar", _cifar_stem)
STEMS.add("imagenet", _imagenet_stem)


class BasicBlock(nn.Module):
    expansion: ClassVar[int] = 1

    def __init__(self, cin: int, planes: int, stride: int, act: str):
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act = make_act(act)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _downsample(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x if self.downsample is None else self.downsample(x)
        return self.act(out + short)


class Bottleneck(nn.Module):
    expansion: ClassVar[int] = 4

    def __init__(self, cin: int, planes: int, stride: int, act: str):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.act = make_act(act)
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.act(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        short = x if self.downsample is None else self.downsample(x)
        return self.act(out + short)


class ResNet(TrunkClassifier):
    """ResNet; feature = global average of the last stage (512·expansion).

    ``stem="cifar"`` (default) or ``"imagenet"`` (torchvision's; adds the
    parameter-free ``maxpool`` to the trunk)."""

    classifier_name = "fc"
    trunk_names = (
        "conv1",
        "bn1",
        "act",
        "layer1",
        "layer2",
        "layer3",
        "layer4",
        "global_pool",
        "flatten",
    )

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: tuple[int, int, int, int],
        num_classes: int = 10,
        in_chans: int = 3,
        act: str = "relu",
        width: int = 64,
        img_size: int | None = None,
        stem: str = "cifar",
    ):
        """``img_size`` is accepted for a uniform interface and unused: the
        feature is globally pooled, so any input of at least 8 px works."""
        super().__init__()
        del img_size
        check_positive("num_classes", num_classes)
        check_positive("in_chans", in_chans)
        check_positive("width", width)
        if not isinstance(stem, str):
            raise ConfigError(f"stem must be a name ({', '.join(STEMS.names())}), got {stem!r}")
        self.num_classes = num_classes
        self.stem = stem
        self.conv1, maxpool = STEMS.get(stem)(in_chans, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.act = make_act(act)
        if maxpool is not None:
            self.maxpool = maxpool
            names = list(self.trunk_names)
            self.trunk_names = (*names[:3], "maxpool", *names[3:])
        cin = width
        for i, (n, mult) in enumerate(zip(layers, (1, 2, 4, 8), strict=True)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width * mult, stride if j == 0 else 1, act))
                cin = width * mult * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.num_features = cin
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def _create_resnet(defaults: dict[str, Any], **kwargs: Any) -> ResNet:
    """Private builder: registered constructors only set the architecture."""
    return ResNet(**{**defaults, **kwargs})


@register_model
def resnet18(**kwargs: Any) -> ResNet:
    """CIFAR ResNet-18 (BasicBlock ×[2, 2, 2, 2], 512-d feature)."""
    return _create_resnet(dict(block=BasicBlock, layers=(2, 2, 2, 2)), **kwargs)


@register_model
def resnet50(**kwargs: Any) -> ResNet:
    """CIFAR ResNet-50 (Bottleneck ×[3, 4, 6, 3], 2048-d feature)."""
    return _create_resnet(dict(block=Bottleneck, layers=(3, 4, 6, 3)), **kwargs)


# torchvision's architecture (ImageNet stem, 1000 classes): torchvision / timm
# resnet18 / resnet50 checkpoints load into these key for key.
_TV = dict(stem="imagenet", num_classes=1000)


@register_model
def tv_resnet18(**kwargs: Any) -> ResNet:
    """torchvision ResNet-18 (ImageNet stem; 11,689,512 parameters at 1000 classes)."""
    return _create_resnet(dict(_TV, block=BasicBlock, layers=(2, 2, 2, 2)), **kwargs)


@register_model
def tv_resnet50(**kwargs: Any) -> ResNet:
    """torchvision ResNet-50 v1.5 (ImageNet stem; 25,557,032 parameters at 1000 classes)."""
    return _create_resnet(dict(_TV, block=Bottleneck, layers=(3, 4, 6, 3)), **kwargs)
