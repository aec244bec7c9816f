"""LLG+: label leakage from the last layer's weight gradient (Wainakh et al.).

Wainakh, Ventola, Müßig, Keim, Cordero, Zimmer, Grube, Kersting &
Mühlhäuser, "User-Level Label Leakage from Gradients in Federated Learning",
PETS 2022 (arXiv 2105.09369). Two properties of softmax-CE with a
non-negative activation before the output layer: (1) the row sum
``g_j = Σ_l ∇W_{j,l}`` is negative only if class ``j`` occurs in the batch;
(2) its magnitude grows with the number of occurrences. With ``O = Σ_l e_l``
(the embedding's sum) the summed gradient is exactly

    g_j = Σ_i (p_j(x_i) − 1[y_i = j]) O(x_i)
        ≈ N_j · m + (total − N_j) · s_j,

with the *impact* ``m = E[(p_y − 1) O]`` of a sample on its own class and
the *offset* ``s_j = E[p_j O | y ≠ j]`` of a sample on another class. LLG
estimates both from dummy data (LLG*); **LLG+** — the variant the RLU paper
compares with — estimates them on the server's auxiliary set with the
global model, which is what we do. Recovery is LLG's two-stage greedy:
every class with ``g_j < 0`` gets one label (the most negative ``r_j`` first
when there are more such classes than labels), then labels go one at a time
to the class with the most negative residual ``r_j = g_j − total·s_j −
(labels given to j)·(m − s_j)`` until ``m·|B|`` labels are assigned.

**Departures from the authors' code** (tklab-tud/LLG 58f3aa2,
``Predictor.LLGp_prediction``; both in ``tests/privacy/label_recovery/test_reference_llg.py``): the
authors scale the mean impact by ``(1 + 1/K)`` over the number of local
iterations and lower a class's residual by that impact per label, an
approximation of the offset term; osfl uses the mean impact itself,
subtracts ``total · s_j`` up front and lowers the residual by the impact
minus ``s_j`` per label, solving the linear model above exactly. With one
offset shared by every class and one local iteration the two rules give the
same counts; with class-dependent offsets osfl recovers the linear model's
counts exactly and the authors' rule need not.

The gradient is the update's surrogate ``G = −ΔW/η · |B|`` (sum over the
``m·|B|`` samples), so no correction for momentum, proximal terms or
control variates is made: LLG+ assumes FedAvg with SGD, as published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.privacy.label_recovery.base import AttackInputs, LabelAttack, Transform, register_attack


@dataclass(frozen=True)
class AuxStatsConfig:
    """``bn_stats``: BatchNorm statistics for the auxiliary forward ("batch"/"running")."""

    bn_stats: str = "batch"

    def __post_init__(self) -> None:
        if self.bn_stats not in ("batch", "running"):
            raise ConfigError(f"bn_stats must be 'batch' or 'running', got {self.bn_stats!r}")


def aux_softmax_features(
    x: AttackInputs, aux: ImageSet, transform: Transform | None, device: torch.device, bn_stats: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax outputs (n×K), embeddings (n×L) and labels (n,) of the auxiliary set
    under the global model."""
    q, e = x.aux_outputs("global", aux, transform, bn_stats=bn_stats, device=device)
    p = torch.softmax(q, dim=1).numpy()
    return p, e.numpy(), aux.labels.numpy()


def llg_counts(g: np.ndarray, impact: float, offset: np.ndarray, total: int) -> np.ndarray:
    """LLG's two-stage greedy on the row sums ``g`` (see the module docstring)."""
    K = g.shape[0]
    counts = np.zeros(K, dtype=np.int64)
    per_label = impact - offset  # change of r_j per label of class j (< 0 when LLG's premise holds)
    r = g - total * offset
    neg = np.flatnonzero(g < 0)
    # more negative classes than labels: the most negative residuals first (the authors' code)
    for j in neg[np.argsort(r[neg], kind="stable")][:total]:
        counts[j] += 1
        r[j] -= per_label[j]
    while counts.sum() < total:
        j = int(np.argmin(r))
        counts[j] += 1
        r[j] -= per_label[j]
    return counts


@register_attack("llg+")
class LLGPlus(LabelAttack):
    """LLG+ (Wainakh et al. 2022) with impact and offset from the auxiliary set."""

    Config = AuxStatsConfig

    def _recover(
        self,
        x: AttackInputs,
        aux: ImageSet | None,
        transform: Transform | None,
        device: torch.device,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        p, e, y = aux_softmax_features(x, aux, transform, device, self.config.bn_stats)
        o_sum = e.sum(axis=1)
        K = x.num_classes
        impact = float(np.mean((p[np.arange(len(y)), y] - 1.0) * o_sum))
        other = np.arange(K)[None, :] != y[:, None]  # sample i is not of class j
        offset = (p * o_sum[:, None] * other).sum(axis=0) / np.maximum(other.sum(axis=0), 1)
        G_W, _ = x.gradient_surrogate()
        g = G_W.sum(axis=1)
        counts = llg_counts(g, impact, offset, x.total_labels)
        return counts, {"impact": impact, "offset": offset.tolist()}
