"""ZLG+: label counts from the last layer's weight gradient and expected
softmax outputs (Geng et al.).

Geng, Mou, Li, Li, Beyan, Decker & Rong, "Towards General Deep Leakage in
Federated Learning", arXiv 2110.09074 (2021). For softmax-CE the summed
output-layer weight gradient of a batch is

    g_j = Σ_l ∇W_{j,l} = Σ_i (p_j(x_i) − 1[y_i = j]) O(x_i),    O = Σ_l e_l,

and replacing ``p_j(x_i)`` and ``O(x_i)`` by their means ``p̄_j`` and ``Ō``
gives ``g_j ≈ Ō (total · p̄_j − N_j)``, i.e.

    N_j ≈ total · p̄_j − g_j / Ō.

ZLG estimates ``p̄`` and ``Ō`` by feeding dummy data to the model; **ZLG+**,
the variant the RLU paper compares with, uses the server's auxiliary set with
the global model instead, as we do. The premise ``Ō > 0`` holds for
non-negative activations (ReLU), which is why ZLG+ degrades with Tanh/ELU.
Negative estimates are clipped to 0 and the rest scaled and rounded to
``m·|B|`` labels by the largest-remainder rule (Dimitrov et al.'s public
code rounds negatives differently: :mod:`~osfl.privacy.label_recovery.zlg_fedavg`
says how). The gradient is the SGD surrogate
``−ΔW/η · |B|`` (no scheme or momentum correction, as published).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.privacy.label_recovery.base import AttackInputs, LabelAttack, Transform, register_attack
from osfl.privacy.label_recovery.llg import AuxStatsConfig, aux_softmax_features
from osfl.privacy.label_recovery.simplex_lsq import largest_remainder


def zlg_estimate(g: np.ndarray, p_mean: np.ndarray, o_mean: Any, total: int) -> np.ndarray:
    """``N_j ≈ total·p̄_j − g_j/Ō``, unrounded; ``p_mean`` (K,) or one row per
    step (T×K) with ``o_mean`` a number or T×1 (broadcast, as ZLG+FedAvg uses it)."""
    o = np.asarray(o_mean, dtype=np.float64)
    return total * p_mean - g / np.where(o == 0.0, 1e-12, o)


def round_counts(estimate: np.ndarray, total: int) -> np.ndarray:
    """An estimate clipped at 0 and rounded to ``total`` labels (largest remainder)."""
    return largest_remainder(np.clip(estimate, 0.0, None), total)


def zlg_counts(g: np.ndarray, p_mean: np.ndarray, o_mean: float, total: int) -> np.ndarray:
    """``N_j = total·p̄_j − g_j/Ō``, clipped at 0 and rounded to ``total`` labels."""
    return round_counts(zlg_estimate(g, p_mean, o_mean, total), total)


@register_attack("zlg+")
class ZLGPlus(LabelAttack):
    """ZLG+ (Geng et al. 2021) with ``p̄`` and ``Ō`` from the auxiliary set."""

    Config = AuxStatsConfig

    def _recover(
        self,
        x: AttackInputs,
        aux: ImageSet | None,
        transform: Transform | None,
        device: torch.device,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        p, e, _ = aux_softmax_features(x, aux, transform, device, self.config.bn_stats)
        p_mean, o_mean = p.mean(axis=0), float(e.sum(axis=1).mean())
        G_W, _ = x.gradient_surrogate()
        counts = zlg_counts(G_W.sum(axis=1), p_mean, o_mean, x.total_labels)
        return counts, {"p_mean": p_mean.tolist(), "o_mean": o_mean}
