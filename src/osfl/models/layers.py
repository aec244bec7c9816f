"""Shared building blocks of the model families: the activation registry and
the :class:`ImageClassifier` interface every registered model implements.

The interface is what the FL methods and privacy audits rely on (docs/design.md §2,
docs/architecture.md): ``forward_features`` gives the pooled (B, D) feature
that prototype methods (FAFI, FedPFT) and feature uploads (EFTViT) use,
``get_classifier`` the last ``nn.Linear`` whose gradient RLU reads
(Ma et al., "Label recovery from gradients ...", the RLU paper in
``papers/``), and ``feature_extractor`` a module that shares the trunk's
parameters. The split of a model into ``forward_features`` / ``forward_head``
follows timm (``timm/models/_features.py`` and ``VisionTransformer``).

It also holds the transformer layers of :mod:`osfl.models.vit`, with timm's
module and parameter names (``timm/models/vision_transformer.py``,
``timm/layers/patch_embed.py``, ``timm/layers/drop.py``), so that timm / DeiT
checkpoints load unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.registry import Registry

#: Activation name -> ``nn.Module`` class (all constructed without arguments
#: except ``inplace`` where the class has it, see :func:`make_act`).
ACTIVATIONS: Registry[type[nn.Module]] = Registry("activation")
ACTIVATIONS.add("relu", nn.ReLU)
ACTIVATIONS.add("tanh", nn.Tanh)
ACTIVATIONS.add("elu", nn.ELU)
ACTIVATIONS.add("selu", nn.SELU)
ACTIVATIONS.add("silu", nn.SiLU)
ACTIVATIONS.add("gelu", nn.GELU)
ACTIVATIONS.add("sigmoid", nn.Sigmoid)
ACTIVATIONS.add("leaky_relu", nn.LeakyReLU)


def get_act_layer(name: str | type[nn.Module]) -> type[nn.Module]:
    """Activation class by registered name (or pass a class through), so that
    model constructors take ``act="tanh"`` from a YAML config."""
    if isinstance(name, type) and issubclass(name, nn.Module):
        return name
    if not isinstance(name, str):
        raise ConfigError(f"act must be an activation name, got {name!r}")
    return ACTIVATIONS.get(name)


def make_act(act: str | type[nn.Module]) -> nn.Module:
    """A fresh activation module. Never in-place: gradient-inversion attacks and
    BN-statistics hooks read intermediate tensors, which in-place ops would
    overwrite."""
    return get_act_layer(act)()


def check_positive(name: str, value: object) -> int:
    """``value`` as a positive int, or a ConfigError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


class ImageClassifier(nn.Module):
    """Base of every registered model: ``forward = forward_head ∘ forward_features``.

    Subclasses set ``num_features`` (D), name their last linear layer in
    ``classifier_name`` and implement ``forward_features`` and
    ``feature_extractor``.
    """

    classifier_name: ClassVar[str] = "fc"
    num_features: int
    num_classes: int

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Images (B, C, H, W) -> pooled feature (B, D)."""
        raise NotImplementedError

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        """Pooled feature (B, D) -> logits (B, num_classes)."""
        return self.get_classifier()(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Linear:
        """The last linear layer (with bias): the gradient RLU reads."""
        return getattr(self, self.classifier_name)

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head by a fresh ``Linear(D, num_classes)`` (fine-tuning a
        pretrained trunk on a new label set)."""
        check_positive("num_classes", num_classes)
        old = self.get_classifier()
        new = nn.Linear(self.num_features, num_classes).to(old.weight.device, old.weight.dtype)
        setattr(self, self.classifier_name, new)
        self.num_classes = num_classes

    def feature_extractor(self) -> nn.Module:  # pragma: no cover - abstract
        """A module mapping images to the (B, D) feature, sharing parameters."""
        raise NotImplementedError


class TrunkClassifier(ImageClassifier):
    """A CNN whose feature is its named children in ``trunk_names`` applied in
    order, then the classifier.

    Keeping the trunk as a list of *names* (not a wrapping ``nn.Sequential``)
    keeps torchvision-style parameter names (``conv1``, ``layer1.0.bn1``, ...)
    and lets :meth:`feature_extractor` return an ``nn.Sequential`` whose
    ``state_dict`` keys are exactly the model's minus the head.
    """

    trunk_names: Sequence[str] = ()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.trunk_names:
            x = getattr(self, name)(x)
        return x

    def feature_extractor(self) -> nn.Sequential:
        return nn.Sequential(OrderedDict((n, getattr(self, n)) for n in self.trunk_names))


# --- transformer layers (timm names: PatchEmbed.proj, Attention.qkv/proj, Mlp.fc1/fc2, ...) ---
LayerNorm = partial(nn.LayerNorm, eps=1e-6)  # timm's ViT default eps


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class PatchEmbed(nn.Module):
    """Image -> (B, N, D) patch tokens with a strided convolution (timm ``PatchEmbed``)."""

    def __init__(
        self, img_size: int | tuple[int, int], patch_size: int, in_chans: int, embed_dim: int
    ):
        super().__init__()
        self.img_size = _pair(img_size)
        self.patch_size = _pair(patch_size)
        if any(s % p for s, p in zip(self.img_size, self.patch_size, strict=True)):
            raise ConfigError(
                f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}; "
                "pick an img_size that is a multiple of the patch size"
            )
        self.grid_size = (
            self.img_size[0] // self.patch_size[0],
            self.img_size[1] // self.patch_size[1],
        )
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(
            in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.img_size or x.shape[1] != self.proj.in_channels:
            raise ConfigError(
                f"ViT built for {self.proj.in_channels}×{self.img_size[0]}×{self.img_size[1]} images, "
                f"got {tuple(x.shape[1:])}; create the model with img_size= / in_chans= "
                "matching the data (or resize the images)"
            )
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention that can also return its softmax weights.

    ``forward`` uses ``F.scaled_dot_product_attention`` (fused kernels, never
    materialising the N×N weights); :meth:`attention_weights` computes them
    explicitly for attention maps (SMI's patch ranking).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"embed_dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax attention weights (B, H, N, N) for normalised tokens ``x``."""
        q, k, _ = self._qkv(x)
        return ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self._qkv(x)
        p = self.attn_drop.p if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class LayerScale(nn.Module):
    """Per-channel residual scale (CaiT / DeiT-III); parameter name ``gamma`` as in timm."""

    def __init__(self, dim: int, init_values: float):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth per sample (Huang et al. 2016), as timm's ``DropPath``."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act_layer: type[nn.Module], drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1 x), then x + mlp(norm2 x)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: Callable[[int], nn.Module] = LayerNorm,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer, drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
