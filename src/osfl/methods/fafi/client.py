"""FAFI's client side: the network a client trains and its SALT objective.

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
  change to the engine.
* :class:`SaltLoss` is that ``loss_fn``: weighted Eq. 4 + Eq. 5 (+ CE and
  prototype separation when asked).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.transforms import Transform
from osfl.fl.cache import transform_key
from osfl.methods.fafi.losses import (
    contrastive_loss,
    prototype_loss,
    prototype_scores,
    prototype_separation_loss,
)


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


@dataclass(frozen=True)
class SaltLoss:
    """The engine's ``loss_fn(model, x, y)`` for SALT; ``x`` comes from :class:`TwoViews`.

    ``ssl_weight * L_ssl + proto_weight * L_proto + ce_weight * CE +
    sep_weight * L_sep``. ``L_ssl`` runs at ``ssl_tau``, ``L_proto`` and
    ``L_sep`` at ``proto_tau`` (``None``: both ``tau``, the paper's single
    temperature). ``L_proto`` and CE see the features of both views.
    ``proto_similarity`` scores features against prototypes (``cosine``:
    the paper; ``unit_feature``: normalised feature · raw prototype, the public
    code, whose separation term then also uses the raw ``P·Pᵀ``).
    """

    tau: float = 0.5
    ssl_weight: float = 1.0
    proto_weight: float = 1.0
    ce_weight: float = 0.0
    sep_weight: float = 0.0
    ssl_labels: bool = True
    ssl_denominator: str = "negatives"
    proto_denominator: str = "negatives"
    ssl_tau: float | None = None
    proto_tau: float | None = None
    proto_similarity: str = "cosine"

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b = y.shape[0]
        if x.shape[0] != 2 * b:
            raise ValueError(
                f"SALT expects two views per sample ({2 * b} images for {b} labels), got "
                f"{x.shape[0]}: train with the TwoViews transform"
            )
        f = model.features(x)
        yy = torch.cat([y, y])
        ssl_tau = self.tau if self.ssl_tau is None else self.ssl_tau
        proto_tau = self.tau if self.proto_tau is None else self.proto_tau
        loss = f.new_zeros((), dtype=torch.float32)
        if self.ssl_weight:
            f1, f2 = f[:b], f[b:]
            labels = y if self.ssl_labels else None
            loss = loss + self.ssl_weight * contrastive_loss(
                f1, f2, labels, tau=ssl_tau, denominator=self.ssl_denominator
            )
        if self.proto_weight:
            loss = loss + self.proto_weight * prototype_loss(
                f,
                model.prototypes,
                yy,
                tau=proto_tau,
                denominator=self.proto_denominator,
                similarity=self.proto_similarity,
            )
        if self.ce_weight:
            loss = loss + self.ce_weight * F.cross_entropy(model.logits(f).float(), yy)
        if self.sep_weight:
            loss = loss + self.sep_weight * prototype_separation_loss(
                model.prototypes, tau=proto_tau, normalize=self.proto_similarity == "cosine"
            )
        return loss

    def key(self) -> dict[str, Any]:
        return asdict(self)
