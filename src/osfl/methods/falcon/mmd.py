"""Maximum mean discrepancy between real and synthetic token sequences.

Liu et al., FALCON (2025), §3.4 and Table 4 compare the generator variants
(M-AR, AR, NAR) by the MMD between a client's real sequences and the
sequences its generator draws. The paper does not give the kernel; here it
is the usual choice (Gretton et al., "A Kernel Two-Sample Test", JMLR 2012,
Eq. 3 for the unbiased MMD²ᵤ): a Gaussian kernel on the flattened sequences
(V·D values) with the median heuristic for the bandwidth (median pairwise
distance of the pooled sample), computed in float64.
"""

from __future__ import annotations

import torch

__all__ = ["median_bandwidth", "mmd2"]


def _sq_dists(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cdist(a, b).pow(2)


def median_bandwidth(x: torch.Tensor, y: torch.Tensor) -> float:
    """Median pairwise Euclidean distance of the pooled, flattened samples."""
    z = torch.cat([x.flatten(1), y.flatten(1)]).double()
    d = torch.cdist(z, z)
    off = d[~torch.eye(len(z), dtype=torch.bool)]
    return float(off.median()) if off.numel() else 1.0


def mmd2(
    x: torch.Tensor, y: torch.Tensor, bandwidth: float | None = None, unbiased: bool = True
) -> float:
    """MMD² between samples ``x`` (n, ...) and ``y`` (m, ...) under
    k(a, b) = exp(−‖a − b‖² / (2σ²)); σ: ``bandwidth`` or the median
    heuristic. ``unbiased`` drops the diagonal terms (can be slightly < 0)."""
    a, b = x.flatten(1).double(), y.flatten(1).double()
    if len(a) < 2 or len(b) < 2:
        raise ValueError("mmd2 needs at least two samples on each side")
    sigma = bandwidth if bandwidth is not None else median_bandwidth(a, b)
    gamma = 1.0 / (2.0 * max(sigma, 1e-12) ** 2)
    kxx = torch.exp(-gamma * _sq_dists(a, a))
    kyy = torch.exp(-gamma * _sq_dists(b, b))
    kxy = torch.exp(-gamma * _sq_dists(a, b))
    n, m = len(a), len(b)
    if unbiased:
        sx = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
        sy = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    else:
        sx, sy = kxx.mean(), kyy.mean()
    return float(sx + sy - 2 * kxy.mean())
