"""SALT, FAFI's client objective, and its options (``method.fafi.loss.*``).

Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025, §4.2, Eq. 4–6:
``L = ssl_weight * L_ssl + proto_weight * L_proto`` on two augmented views of
every sample, plus the public code's extras (a CE term and prototype
self-separation), off by default.

:class:`SaltLoss` is at once the option group ``loss`` of
:class:`~osfl.methods.fafi.config.FAFIConfig` and the training engine's
``loss_fn(model, x, y)``: each loss option is declared here only, and its
:meth:`SaltLoss.key` is the client-cache key of the objective.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.fafi.losses import (
    DENOMINATORS,
    SIMILARITIES,
    contrastive_loss,
    prototype_loss,
    prototype_separation_loss,
)


@dataclass(frozen=True)
class SaltLoss:
    """The engine's ``loss_fn(model, x, y)`` for SALT; ``x`` comes from
    :class:`~osfl.methods.fafi.client.TwoViews`.

    ``ssl_weight * L_ssl + proto_weight * L_proto + ce_weight * CE +
    sep_weight * L_sep``. ``L_ssl`` runs at ``ssl_tau``, ``L_proto`` and
    ``L_sep`` at ``proto_tau`` (``None``: both ``tau``, the paper's single
    temperature, 0.5 in Appendix E). ``L_proto`` and CE see the features of
    both views. ``ssl_labels``: Eq. 4's same-label positives (``False``: the
    other view only, SimCLR). Denominators: ``negatives`` is Eq. 4–5 as
    written, ``all`` the SupCon / softmax form of the public code.
    ``proto_similarity`` scores features against prototypes (``cosine``: the
    paper; ``unit_feature``: normalised feature · raw prototype, the public
    code, whose separation term then also uses the raw ``P·Pᵀ``).
    """

    #: temperature of the contrastive and prototype terms
    tau: float = 0.5
    #: weight of the self-supervised contrastive term
    ssl_weight: float = 1.0
    #: weight of the prototype-alignment term
    proto_weight: float = 1.0
    #: weight of a cross-entropy classifier term (0: off, as in the paper)
    ce_weight: float = 0.0
    #: weight of the prototype-separation term (0: off, as in the paper)
    sep_weight: float = 0.0
    #: same-label samples are positives of the contrastive term (false: the other view only,
    #: SimCLR)
    ssl_labels: bool = True
    #: contrastive denominator: negatives (the paper) or all (SupCon, the public code)
    ssl_denominator: str = "negatives"
    #: prototype-term denominator: negatives (the paper) or all (softmax over prototypes)
    proto_denominator: str = "negatives"
    #: temperature of the contrastive term alone (null: tau)
    ssl_tau: float | None = None
    #: temperature of the prototype and separation terms (null: tau)
    proto_tau: float | None = None
    #: feature-prototype similarity: cosine (the paper), unit_feature (the public code) or dot
    proto_similarity: str = "cosine"

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"loss: {msg}")

        need(self.tau > 0, f"tau must be > 0, got {self.tau}")
        for name in ("ssl_tau", "proto_tau"):
            value = getattr(self, name)
            need(value is None or value > 0, f"{name} must be > 0 or null, got {value}")
        for name in ("ssl_weight", "proto_weight", "ce_weight", "sep_weight"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(
            self.ssl_weight + self.proto_weight + self.ce_weight > 0,
            "at least one of ssl_weight, proto_weight, ce_weight must be > 0",
        )
        for name in ("ssl_denominator", "proto_denominator"):
            need(
                getattr(self, name) in DENOMINATORS,
                f"{name} must be one of {', '.join(DENOMINATORS)}, got {getattr(self, name)!r}",
            )
        need(
            self.proto_similarity in SIMILARITIES,
            f"proto_similarity must be one of {', '.join(SIMILARITIES)}, "
            f"got {self.proto_similarity!r}",
        )
        need(
            self.proto_similarity == "cosine" or self.proto_denominator == "all",
            f"proto_similarity={self.proto_similarity!r} needs proto_denominator='all' "
            "(with the negatives-only denominator raw prototypes make L_proto unbounded below)",
        )

    @property
    def plain_ce(self) -> bool:
        """SALT off: only the CE term (paper Table 3, first two rows)."""
        return self.ssl_weight == 0 and self.proto_weight == 0 and self.sep_weight == 0

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
        """The objective's part of the client-cache key: every option."""
        return asdict(self)
