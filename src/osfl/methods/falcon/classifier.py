"""FALCON's classifier on token sequences: attention pooling with a learnable
query, then a classification head.

Liu et al., FALCON (2025), §2.6, Eqs. 6–9: K = sW_k, V = sW_v (Eq. 6),
α = softmax(qKᵀ/√d) (Eq. 7), s_sem = αV (Eq. 8), ŷ = h_cls(s_sem) (Eq. 9).
The paper leaves h_cls open; the authors' code (and the paper's classifier
size, ≈22.5 MB ≈ 5.6 M parameters at d = 768) use a residual query
(s_sem + q) and an MLP d → 4d → d (ReLU, dropout 0.3) before the linear
layer, which is the default here (``mlp_ratio=0`` gives a linear head).
The same design is the clients' local classifiers and the server's
student (§2.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from osfl.errors import ConfigError

__all__ = ["AttentionPoolClassifier", "ClassifierConfig"]


@dataclass(frozen=True)
class ClassifierConfig:
    """Head design (paper code: residual query, MLP ratio 4, dropout 0.3)."""

    #: hidden width of the classifier's MLP as a multiple of the token width
    mlp_ratio: float = 4.0
    #: dropout rate of the classifier
    dropout: float = 0.3
    #: add the class query back after attention (the authors' code)
    residual_query: bool = True

    def __post_init__(self) -> None:
        if self.mlp_ratio < 0:
            raise ConfigError(f"classifier.mlp_ratio must be >= 0, got {self.mlp_ratio}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"classifier.dropout must lie in [0, 1), got {self.dropout}")


class AttentionPoolClassifier(nn.Module):
    """Token sequence (B, T, D) -> logits (B, C) (Eqs. 6–9)."""

    def __init__(self, dim: int, num_classes: int, cfg: ClassifierConfig):
        super().__init__()
        self.dim = dim
        self.residual_query = cfg.residual_query
        self.query = nn.Parameter(torch.randn(dim) / math.sqrt(dim))
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim, bias=False)
        nn.init.xavier_uniform_(self.key.weight)
        nn.init.xavier_uniform_(self.value.weight)
        hidden = round(dim * cfg.mlp_ratio)
        self.mlp: nn.Module = (
            nn.Sequential(
                nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim), nn.Dropout(cfg.dropout)
            )
            if hidden > 0
            else nn.Identity()
        )
        self.head = nn.Linear(dim, num_classes)

    def attention(self, s: torch.Tensor) -> torch.Tensor:
        """α (B, T): the query's attention over the sequence (Eq. 7)."""
        k = self.key(s)
        return torch.softmax(k @ self.query / math.sqrt(self.dim), dim=-1)

    def pool(self, s: torch.Tensor) -> torch.Tensor:
        """s_sem (B, D) = αV (Eq. 8), plus q with ``residual_query``."""
        pooled = (self.attention(s).unsqueeze(-1) * self.value(s)).sum(dim=1)
        return pooled + self.query if self.residual_query else pooled

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        if s.ndim == 2:  # a single token per sample (w/o HSE)
            s = s.unsqueeze(1)
        return self.head(self.mlp(self.pool(s)))
