"""FAFI's client side: the network a client trains and its two views of a batch.

Zeng et al., ICML 2025, §4.2 and Algorithm 1: a client trains a feature
extractor ``theta_m`` and learnable class prototypes ``P_m`` (C×D) with
``L_ssl + L_proto`` (Eq. 6) on two augmented views of every sample, then
uploads the extractor and the prototypes only.

* :class:`FAFINet` wraps any registered osfl model: its ``forward_features``
  is the extractor, followed by an optional projection to ``feature_dim``
  (so clients of different architectures, the paper's Table 8, share one
  feature space dimension), the prototypes, and a linear head used only by
  the optional plain-CE term (the public code's extra).
* :class:`TwoViews` turns a batched augmentation pipeline into one that
  returns two independently augmented copies of a batch, stacked, so that
  the training engine's ``loss_fn(model, x, y)`` sees both views without any
  change to the engine (:class:`~osfl.methods.fafi.salt.SaltLoss` is that
  ``loss_fn``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from osfl.data.transforms import Transform
from osfl.fl.cache import transform_key
from osfl.methods.fafi.losses import prototype_scores


class FAFIExtractor(nn.Module):
    """Images -> D-dim feature: the backbone's trunk, then the projection."""

    def __init__(self, trunk: nn.Module, proj: nn.Module):
        super().__init__()
        self.trunk = trunk
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.trunk(x))


class FAFINet(nn.Module):
    """A backbone (any ``osfl.models`` classifier) + projection + prototypes + head.

    ``feature_dim=None`` (or equal to the backbone's ``num_features``) means no
    projection; then the backbone's own classifier is the CE head, so a
    CE-only FAFINet is exactly the plain model. Prototypes are initialised
    with unit-norm-ish rows (``N(0, 1/D)``); cosine similarity makes their
    scale irrelevant to the losses.
    """

    def __init__(self, backbone: nn.Module, num_classes: int, feature_dim: int | None = None):
        super().__init__()
        nf = int(backbone.num_features)
        dim = nf if feature_dim is None else int(feature_dim)
        self.backbone = backbone
        self.proj: nn.Module = nn.Linear(nf, dim) if dim != nf else nn.Identity()
        self.head: nn.Module | None = nn.Linear(dim, num_classes) if dim != nf else None
        self.prototypes = nn.Parameter(torch.randn(num_classes, dim) / math.sqrt(dim))
        self.feature_dim = dim

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """B×D features (what SALT trains and IFFI fuses)."""
        return self.proj(self.backbone.forward_features(x))

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """Classifier logits of features, for the plain-CE term."""
        if self.head is None:
            return self.backbone.forward_head(f)
        return self.head(f)

    def head_weight(self) -> torch.Tensor:
        """C×D weights of the CE head (the "classifier" prototypes of Table 4)."""
        head = self.head if self.head is not None else self.backbone.get_classifier()
        return head.weight

    def extractor(self) -> FAFIExtractor:
        """The uploadable extractor (shares parameters; no head, no prototypes)."""
        return FAFIExtractor(self.backbone.feature_extractor(), self.proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Cosine scores to this client's own prototypes (a client-alone classifier)."""
        return prototype_scores(self.features(x), self.prototypes)


class TwoViews(Transform):
    """Two independent draws of ``base`` on the same batch, stacked: (2B, C, H, W).

    Rows ``i`` and ``B + i`` are two views of sample ``i``; every sample gets
    its own random crop/flip/jitter in each view (the public code draws one
    per batch; docs/design.md §8).
    """

    def __init__(self, base: Transform):
        self.base = base

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.cat([self.base(x, generator), self.base(x, generator)])

    def key(self) -> Any:
        return {"two_views": transform_key(self.base)}
