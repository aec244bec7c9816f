"""ZLG+ across FedAvg's local steps: label counts from a multi-epoch update
(Dimitrov et al.; Geng et al.).

Dimitrov, Balunović, Konstantinov & Vechev, "Data Leakage in Federated
Averaging", TMLR 2022, §4 "label reconstruction"; public code
``eth-sri/fedavg_leakage`` (``restore_labels``). Geng et al.'s count
estimate (:mod:`osfl.privacy.label_recovery.zlg`),

    N_j ≈ total · p̄_j − g_j / Ō,

reads the softmax mean ``p̄`` and the embedding-sum mean ``Ō`` at the model
the gradient was taken at. In FedAvg the client takes ``T`` local steps
(``epochs × batches``) at models the server never sees, so one estimate at
the start model is biased once the model moves. Dimitrov et al. estimate
``p̄`` and ``Ō`` at the two models the server does see, the global model
θ (step 0) and the returned local model θ_k (step T), interpolate them
linearly over the steps, ``p̄(t) = (1 − t/T) p̄(θ) + (t/T) p̄(θ_k)`` (and
``Ō(t)`` alike) for t = 0..T−1, compute the count estimate of every step
against the mean per-step gradient, and average the estimates before
rounding. ``interpolate: start`` is Geng et al.'s estimate at θ (ZLG+ with
the update as gradient surrogate), ``end`` the estimate at θ_k alone,
``steps`` (the default) Dimitrov et al.'s average.

As in ZLG+ (and LLG+) the statistics come from the server's auxiliary set,
the variant the RLU paper compares with; the public code feeds Gaussian
dummy inputs instead (Geng et al.'s original ZLG). Negative estimates are
clipped to 0, the clipped estimate scaled to ``m·|B|`` labels and rounded
by the largest-remainder rule. **This departs from the public code**
(``round_label_cnts``): it floors the raw estimate with negatives set to 0
and, when that leaves too many labels, takes the excess from the classes
with the smallest remainders. Without a negative raw estimate both give the
same counts; with one they can differ (raw ``[3.9, 3.9, 3.9, −3.7]`` for 8
labels: the code ``[2, 3, 3, 0]``, osfl ``[3, 3, 2, 0]``;
``tests/privacy/label_recovery/test_reference_zlg.py``). The gradient is the SGD surrogate ``−ΔW/η·|B|``:
no momentum or scheme correction, as published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.privacy.label_recovery.base import AttackInputs, LabelAttack, Transform, register_attack
from osfl.privacy.label_recovery.llg import AuxStatsConfig
from osfl.privacy.label_recovery.zlg import round_counts, zlg_estimate

Stats = tuple[np.ndarray, float]  # p̄ (K,) and Ō of the auxiliary set under one model

#: Which model's statistics stand at step 0 and at step T (see the module docstring).
INTERPOLATIONS: dict[str, tuple[str, str]] = {
    "steps": ("global", "local"),
    "start": ("global", "global"),
    "end": ("local", "local"),
}


@dataclass(frozen=True)
class ZLGFedAvgConfig(AuxStatsConfig):
    """``interpolate``: ``steps`` (Dimitrov et al.: the mean estimate over the
    local steps, statistics interpolated between the global and the local
    model), ``start`` (Geng et al.: the global model only) or ``end`` (the
    local model only)."""

    interpolate: str = "steps"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.interpolate not in INTERPOLATIONS:
            raise ConfigError(
                f"interpolate must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolate!r}"
            )


def _stats(
    x: AttackInputs,
    which: str,
    aux: ImageSet,
    transform: Transform | None,
    device: torch.device,
    bn_stats: str,
) -> Stats:
    """``p̄`` (K,) and ``Ō`` of the auxiliary set under the global or the local model."""
    q, e = x.aux_outputs(which, aux, transform, bn_stats=bn_stats, device=device)
    return torch.softmax(q.double(), dim=1).mean(dim=0).numpy(), float(e.double().sum(dim=1).mean())


def interpolated_counts(
    g: np.ndarray,
    p_start: np.ndarray,
    o_start: float,
    p_end: np.ndarray,
    o_end: float,
    total: int,
    steps: int,
) -> np.ndarray:
    """Mean over the ``steps`` local steps of ``total·p̄(t) − g/Ō(t)``, with
    ``p̄(t)``, ``Ō(t)`` linear from the start (t = 0) towards the end model
    (t/T for t < T, as the public code's ``arange(0, 1, 1/T)``); unrounded."""
    t = np.arange(steps, dtype=np.float64)[:, None] / steps  # T×1
    p = (1.0 - t) * p_start[None, :] + t * p_end[None, :]
    o = (1.0 - t) * o_start + t * o_end
    return zlg_estimate(g[None, :], p, o, total).mean(axis=0)


@register_attack("zlg+fedavg")
class ZLGFedAvg(LabelAttack):
    """Dimitrov et al. (2022): ZLG+ with statistics interpolated over the local steps."""

    Config = ZLGFedAvgConfig

    def _recover(
        self,
        x: AttackInputs,
        aux: ImageSet | None,
        transform: Transform | None,
        device: torch.device,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        bn, mode = self.config.bn_stats, self.config.interpolate
        start, end = INTERPOLATIONS[mode]  # aux_outputs is memoised: "global" twice costs once
        p0, o0 = _stats(x, start, aux, transform, device, bn)
        p1, o1 = _stats(x, end, aux, transform, device, bn)
        G_W, _ = x.gradient_surrogate()
        raw = interpolated_counts(G_W.sum(axis=1), p0, o0, p1, o1, x.total_labels, x.train.steps)
        info = {"interpolate": mode, "o_start": o0, "o_end": o1, "raw": raw.tolist()}
        return round_counts(raw, x.total_labels), info
