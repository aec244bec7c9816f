"""What median sampling lets a server read of a client's label distribution.

A client that uploaded one patch feature per training image (no sampling)
would hand the server its class histogram outright. EFTViT's median
sampling (§3.4, :mod:`.sampling`) uploads the same number of features for
every class the client holds, so the histogram the server reads is flat on
the client's classes: it still learns *which* classes the client holds (the
support), not how many of each. :func:`histogram_exposure` measures both for
one client: the histograms the server reads without and with sampling, and
their total-variation distance to the client's true label distribution
(0 = the server reads it exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from osfl.methods.eftvit.sampling import plan_sampling


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """½ Σ |p/Σp − q/Σq| between two non-negative count vectors."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    return float(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())


def histogram_exposure(
    class_counts: Sequence[int] | np.ndarray,
    epochs: int,
    quantile: float = 0.5,
    pad: bool = True,
) -> dict[str, Any]:
    """The class histogram a server reads from one client's upload, before
    (one feature per image) and after median sampling, with the total-variation
    distance of each to the client's true label distribution and whether the
    client's set of classes is disclosed."""
    counts = np.asarray(class_counts, dtype=np.int64)
    plan = plan_sampling(counts, epochs, quantile, pad)
    after = np.asarray(plan.uploaded, dtype=np.int64)
    return {
        "before": counts.tolist(),
        "after": after.tolist(),
        "threshold": plan.threshold,
        "tv_before": total_variation(counts, counts),
        "tv_after": total_variation(counts, after),
        "support_disclosed": bool(np.array_equal(counts > 0, after > 0)),
    }
