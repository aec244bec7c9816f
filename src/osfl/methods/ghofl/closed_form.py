"""GH-OFL's client statistics and its closed-form heads (NB / LDA / QDA).

The equations are in the package docstring (:mod:`osfl.methods.ghofl`);
this module computes them from summed float64 statistics, so the heads do
not depend on how the data were split.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.fedcgs import (
    ABSENT_CLASS_BIAS,
    MAX_STATISTIC,
    client_statistics,
    statistics_problem,
)

__all__ = [
    "MOMENT_KEYS",
    "GaussianClassHead",
    "class_gaussians",
    "class_moments",
    "gaussian_head",
    "moments_problem",
    "shrink_to_identity",
]

#: The second-moment tensor each head's clients upload (besides ``class_sums``):
#: the learned heads need per-class covariances (their synthesis), as QDA does.
MOMENT_KEYS = {
    "nb": "class_squares",
    "lda": "second_moment",
    "qda": "class_second_moments",
    "fishermix": "class_second_moments",
    "protohyper": "class_second_moments",
}


def class_moments(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: str
) -> dict[str, torch.Tensor]:
    """A client's float64 statistics for ``head``: ``class_sums`` (C, D),
    ``class_counts`` (C,) int64 and the head's second moment
    (:data:`MOMENT_KEYS`): lda's is FedCGS's :func:`client_statistics`."""
    key = MOMENT_KEYS[head]
    if key == "second_moment":
        return client_statistics(features, labels, num_classes)
    f = features.double()
    d = f.shape[1]
    sums = torch.zeros(num_classes, d, dtype=torch.float64).index_add_(0, labels, f)
    out = {"class_sums": sums, "class_counts": torch.bincount(labels, minlength=num_classes)}
    if key == "class_squares":
        out[key] = torch.zeros_like(sums).index_add_(0, labels, f * f)
    else:  # one class at a time: N·D² floats at once would not fit for real encoders
        second = torch.zeros(num_classes, d, d, dtype=torch.float64)
        for c in torch.unique(labels).tolist():
            fc = f[labels == c]
            second[c] = fc.T @ fc
        out[key] = second
    return out


def moments_problem(
    head: str, class_sums: torch.Tensor, class_counts: list[int], moment: torch.Tensor
) -> str | None:
    """Why one client's statistics for ``head`` cannot come from any features
    (``None``: they can). lda: FedCGS's :func:`statistics_problem`. Per-class
    second moments (qda and the learned heads): the same check class by class
    (B_c symmetric, B_c − S_c S_cᵀ/n_c PSD), and no moment for a class without
    samples. nb: no moment for a class without samples, values within
    :data:`MAX_STATISTIC`, and no negative variance (n_c Q_c ≥ S_c²,
    Cauchy–Schwarz)."""
    key = MOMENT_KEYS[head]
    if key == "second_moment":
        return statistics_problem(class_sums, class_counts, moment)
    n_c = torch.tensor(class_counts, dtype=torch.float64)
    if bool((moment[n_c == 0] != 0).any()):
        return f"{key}: a nonzero moment for a class with no samples"
    if key == "class_second_moments":
        for c, n in enumerate(class_counts):
            why = statistics_problem(class_sums[c : c + 1], [n], moment[c])
            if why is not None:
                return f"class {c} ({key}[{c}], class_sums[{c}]): {why}"
        return None
    if bool((class_sums[n_c == 0] != 0).any()):
        return "class_sums: a nonzero sum for a class with no samples"
    for name, t in (("class_sums", class_sums), (key, moment)):
        if bool((t.abs() > MAX_STATISTIC).any()):
            return f"{name}: values beyond {MAX_STATISTIC:g}"
    spread = n_c[:, None] * moment - class_sums.square()  # n_c² · variance
    tol = 1e-8 * (n_c[:, None] * moment.abs() + class_sums.square()) + 1e-300
    bad = (spread < -tol).nonzero()
    if len(bad):
        c, d = (int(i) for i in bad[0])
        return f"{key}: a negative variance (class {c}, feature {d}): Σ f² < (Σ f)² / n_c"
    return None


def shrink_to_identity(sigma: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """(1 − λ) Σ + λ (tr Σ / D) I for covariances (…, D, D): the authors'
    ``shrink_cov`` (toward the identity scaled to Σ's own mean variance, so
    the blend is scale-free)."""
    d = sigma.shape[-1]
    mean_var = sigma.diagonal(dim1=-2, dim2=-1).mean(-1).clamp(min=0.0)
    eye = torch.eye(d, dtype=sigma.dtype)
    return (1.0 - shrinkage) * sigma + shrinkage * mean_var[..., None, None] * eye


def class_gaussians(
    sums: torch.Tensor, counts: torch.Tensor, moment: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(μ (C, D), Σ_c, Σ_W, present (C,))`` from summed statistics: the
    unbiased class covariances Σ_c = M_c / (n_c − 1) (Σ_W for a class with
    fewer than two samples: no spread of its own) and the pooled within-class
    Σ_W = Σ_c M_c / (N − K); ``moment`` (C, D, D) gives full matrices, (C, D)
    (nb) their diagonals."""
    n_c = counts.double()
    present = n_c > 0
    n, k = float(n_c.sum()), int(present.sum())
    full = moment.ndim == 3
    mu = torch.where(present[:, None], sums / n_c.clamp(min=1)[:, None], 0.0)
    if full:
        sym = 0.5 * (moment + moment.transpose(1, 2))  # exact symmetry before solving
        scatter = sym - n_c[:, None, None] * mu[:, :, None] * mu[:, None, :]
    else:
        scatter = (moment - n_c[:, None] * mu.square()).clamp(min=0.0)  # rounding only
    pooled = scatter.sum(0) / (n - k) if n - k >= 1 else torch.zeros_like(scatter[0])
    shape = (-1,) + (1,) * (scatter.ndim - 1)
    own = (n_c >= 2).view(shape)
    sigma = torch.where(own, scatter / (n_c - 1).clamp(min=1).view(shape), pooled)
    return mu, sigma, pooled, present


#: The authors' floor on nb's variances (their ``clamp_min(1e-6)``): a feature
#: constant within a class would otherwise make nb singular whatever λ.
NB_VARIANCE_FLOOR = 1e-6


def _regularise(
    sigma: torch.Tensor, pooled: torch.Tensor, *, shrinkage: float, ridge: float, pooling: float
) -> torch.Tensor:
    """Σ̂ = (1 − λ) Σ' + λ (tr Σ'/D) I + r I with Σ' = (1 − α) Σ + α Σ_W and
    r = ridge · tr(Σ_W)/D; where a trace is 0 (no spread at all) the target
    is I itself. ``sigma`` (C, D, D), or (C, D) diagonals (nb, whose
    variances are then floored at :data:`NB_VARIANCE_FLOOR`) with ``pooled`` (D,)."""
    full = sigma.ndim == 3
    d = sigma.shape[-1]
    blend = (1.0 - pooling) * sigma + pooling * pooled
    if full:
        own = blend.diagonal(dim1=1, dim2=2).mean(1)
        spread = float(pooled.diagonal().sum()) / d
        eye = torch.eye(d, dtype=torch.float64)
        target = torch.where(own > 0, own, 1.0)[:, None, None] * eye
    else:
        own = blend.mean(1, keepdim=True)
        spread = float(pooled.sum()) / d
        eye = torch.ones(d, dtype=torch.float64)
        target = torch.where(own > 0, own, 1.0) * eye
    r = ridge * (spread if spread > 0 else 1.0)
    out = (1.0 - shrinkage) * blend + shrinkage * target + r * eye
    return out if full else out.clamp(min=NB_VARIANCE_FLOOR)


def _singular_error(what: str, shrinkage: float, ridge: float) -> ConfigError:
    return ConfigError(
        f"ghofl: {what} singular (fewer samples than feature dimensions, or collinear "
        f"features); raise the head's shrinkage (now {shrinkage}) or method.ghofl.ridge "
        f"(now {ridge})"
    )


def _lda(
    sums: torch.Tensor,
    counts: torch.Tensor,
    second: torch.Tensor,
    *,
    shrinkage: float,
    ridge: float,
) -> dict[str, torch.Tensor]:
    """LDA ``{"weight" (C, D), "bias" (C,)}``: g_c(f) = μ_cᵀ Σ̂⁻¹ f − ½ μ_cᵀ Σ̂⁻¹ μ_c
    + log π_c with Σ̂ the regularised pooled within-class covariance, from
    FedCGS's upload (Σ_c B_c = ``second``): M_W = B − Σ_c n_c μ_c μ_cᵀ."""
    n_c = counts.double()
    present = n_c > 0
    n, k, d = float(n_c.sum()), int(present.sum()), sums.shape[1]
    mu = torch.where(present[:, None], sums / n_c.clamp(min=1)[:, None], 0.0)
    b2 = 0.5 * (second + second.T)
    scatter = b2 - (n_c[:, None, None] * mu[:, :, None] * mu[:, None, :]).sum(0)
    pooled = scatter / (n - k) if n - k >= 1 else torch.zeros_like(b2)
    sigma_hat = _regularise(pooled[None], pooled, shrinkage=shrinkage, ridge=ridge, pooling=0.0)[0]
    eig = torch.linalg.eigvalsh(sigma_hat)
    if not float(eig[0]) > d * torch.finfo(torch.float64).eps * float(eig[-1].abs()):
        raise _singular_error("the pooled feature covariance is", shrinkage, ridge)
    w = torch.linalg.solve(sigma_hat, mu.T).T
    prior = torch.log(n_c.clamp(min=1) / n)
    b = -0.5 * (mu * w).sum(1) + prior
    return {"weight": w, "bias": torch.where(present, b, torch.full_like(b, ABSENT_CLASS_BIAS))}


def gaussian_head(
    head: str,
    class_sums: torch.Tensor,
    class_counts: torch.Tensor,
    moment: torch.Tensor,
    *,
    shrinkage: float,
    ridge: float = 0.0,
    pooling: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The closed-form head of the package docstring from summed statistics:
    lda ``{"weight", "bias"}`` (for FedCGS's :class:`GaussianHead`), nb/qda
    ``{"mean", "whiten", "const"}`` for :class:`GaussianClassHead` (Σ̂_c⁻¹ =
    U_c U_cᵀ, ``whiten`` U_c (C, D, D), or 1/σ̂_c (C, D) for nb). Absent
    classes: zero parameters, a bias no score reaches."""
    if head == "lda":
        return _lda(class_sums, class_counts, moment, shrinkage=shrinkage, ridge=ridge)
    mu, sigma, pooled, present = class_gaussians(class_sums, class_counts, moment)
    sigma_hat = _regularise(sigma, pooled, shrinkage=shrinkage, ridge=ridge, pooling=pooling)
    d = mu.shape[1]
    if head == "nb":
        low, high = sigma_hat.min(1).values, sigma_hat.max(1).values
    else:
        eig = torch.linalg.eigvalsh(sigma_hat)
        low, high = eig[:, 0], eig[:, -1]
    ok = low > d * torch.finfo(torch.float64).eps * high.abs()
    bad = (~ok & present).nonzero()
    if len(bad):
        what = "variances are" if head == "nb" else "covariance is"
        raise _singular_error(f"class {int(bad[0])}'s {what}", shrinkage, ridge)
    if head == "nb":
        whiten = sigma_hat.rsqrt()
        logdet = sigma_hat.log().sum(1)
    else:
        chol, info = torch.linalg.cholesky_ex(sigma_hat)
        if bool((info != 0).any()):  # numerically indefinite despite the eigenvalue check
            raise _singular_error(
                f"class {int((info != 0).nonzero()[0])}'s covariance is", shrinkage, ridge
            )
        eye = torch.eye(d, dtype=torch.float64).expand_as(chol)
        whiten = torch.linalg.solve_triangular(chol, eye, upper=False).transpose(1, 2)  # L⁻ᵀ
        logdet = 2.0 * chol.diagonal(dim1=1, dim2=2).log().sum(1)
    n_c = class_counts.double()
    prior = torch.log(n_c.clamp(min=1) / n_c.sum())
    const = prior - 0.5 * logdet - 0.5 * d * math.log(2 * math.pi)
    keep = present.view((-1,) + (1,) * (whiten.ndim - 1))
    return {
        "mean": torch.where(present[:, None], mu, 0.0),
        "whiten": torch.where(keep, whiten, 0.0),
        "const": torch.where(present, const, torch.full_like(const, ABSENT_CLASS_BIAS)),
    }


class GaussianClassHead(nn.Module):
    """nb/qda scores log p(f, c) = const_c − ½ ‖(f − μ_c) U_c‖² on the global
    token, in float64; ``whiten`` (C, D, D) full (qda) or (C, D) diagonal (nb)."""

    def __init__(self, mean: torch.Tensor, whiten: torch.Tensor, const: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.double())
        self.register_buffer("whiten", whiten.double())
        self.register_buffer("const", const.double())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = tokens[:, 0] if tokens.ndim == 3 else tokens
        diff = f.double()[:, None, :] - self.mean[None]  # (B, C, D)
        if self.whiten.ndim == 2:
            z = diff * self.whiten
        else:
            z = torch.einsum("bcd,cde->bce", diff, self.whiten)
        return self.const - 0.5 * z.square().sum(-1)
