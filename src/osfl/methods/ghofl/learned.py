"""GH-OFL's learned heads: the Fisher subspace, the synthetic features drawn
in it, FisherMix and Proto-Hyper (equations in the package docstring).

Everything is float64 and driven by one seeded :class:`torch.Generator`
(sampling, initialisation, shuffling), so with a fixed seed the heads depend
on the data only through the summed statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.methods.fedcgs import ABSENT_CLASS_BIAS
from osfl.methods.ghofl.closed_form import shrink_to_identity

__all__ = [
    "JITTER",
    "SYNTHETIC_COVARIANCES",
    "FisherMixHead",
    "LearnedSetup",
    "ProtoHyperHead",
    "fisher_gaussians",
    "fisher_subspace",
    "fishermix_head",
    "protohyper_head",
    "synthesize",
    "synthetic_gaussians",
]

#: Absolute jitter the authors add to every Fisher-space covariance before a
#: Cholesky factor or solve (their ``MIN_EPS``).
JITTER = 1e-6


def _sym(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a + a.transpose(-1, -2))


def fisher_subspace(
    mu: torch.Tensor,
    prior: torch.Tensor,
    pooled: torch.Tensor,
    *,
    shrinkage: float,
    energy: float,
    max_dim: int,
) -> torch.Tensor:
    """V (D, k): the top generalised eigenvectors of (S_B, S_W), S_B = Σ π_c
    (μ_c − μ̄)(μ_c − μ̄)ᵀ, S_W = shrink(Σ_W, λ) + εI, as V = S_W^{-1/2} U_k with
    U the eigenvectors of S_W^{-1/2} S_B S_W^{-1/2}; k the fewest holding
    ``energy`` of its spectrum, within [2, min(max_dim, D)]. Each column's sign
    is fixed (largest |U| entry positive) so that rounding-level changes in the
    statistics cannot flip it."""
    d = mu.shape[1]
    centred = mu - prior @ mu
    between = _sym((centred * prior[:, None]).T @ centred)
    within = _sym(shrink_to_identity(pooled, shrinkage)) + JITTER * torch.eye(d, dtype=mu.dtype)
    evals, evecs = torch.linalg.eigh(within)
    inv_sqrt = (evecs * evals.clamp(min=1e-12).rsqrt()) @ evecs.T
    lam, u = torch.linalg.eigh(_sym(inv_sqrt @ between @ inv_sqrt))
    lam, u = lam.flip(0).clamp(min=0.0), u.flip(1)
    if float(lam.sum()) <= 0:  # one class, or all means equal: no discriminant direction
        return torch.eye(d, dtype=mu.dtype)[:, : min(2, d)].contiguous()
    share = lam.cumsum(0) / lam.sum()
    k = int((share >= energy - 1e-12).nonzero()[0]) + 1
    k = max(min(2, d), min(k, max_dim, d))
    u = u[:, :k]
    lead = u.abs().argmax(0)
    u = u * u[lead, torch.arange(k)].sign()
    return (inv_sqrt @ u).contiguous()


def _class_cov(sigma: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    return sigma


def _pooled_cov(sigma: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    return pooled.expand_as(sigma)


#: ``synthetic_covariance`` → the covariance each class's synthetic features follow.
SYNTHETIC_COVARIANCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "class": _class_cov,
    "pooled": _pooled_cov,
}


def synthetic_gaussians(
    mu: torch.Tensor,
    sigma: torch.Tensor,
    pooled: torch.Tensor,
    projection: torch.Tensor,
    *,
    covariance: str,
    shrinkage: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The law of each class's synthetic features in the Fisher subspace:
    mean μ_c V (P, k) and covariance τ² (Vᵀ shrink(Σ, λ) V + εI) + εI (P, k, k),
    Σ the class's own covariance (``"class"``) or Σ_W (``"pooled"``)."""
    k = projection.shape[1]
    eye = JITTER * torch.eye(k, dtype=mu.dtype)
    cov = shrink_to_identity(_sym(SYNTHETIC_COVARIANCES[covariance](sigma, pooled)), shrinkage)
    cov_f = _sym(projection.T @ cov @ projection) + eye
    return mu @ projection, scale**2 * cov_f + eye


def synthesize(
    mean: torch.Tensor, cov: torch.Tensor, per_class: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` draws of each Gaussian, class by class: z = m_c + L_c ε
    (L_c the Cholesky factor of cov_c), labels the row index of ``mean``."""
    chol = torch.linalg.cholesky(_sym(cov))
    eps = torch.randn(
        mean.shape[0], per_class, mean.shape[1], generator=generator, dtype=mean.dtype
    )
    z = mean[:, None, :] + eps @ chol.transpose(1, 2)
    y = torch.arange(mean.shape[0]).repeat_interleave(per_class)
    return z.reshape(-1, mean.shape[1]), y


@dataclass(frozen=True)
class LearnedSetup:
    """What both learned heads start from: the present classes' Fisher
    projection, log priors and synthetic training set."""

    present: torch.Tensor  # (C,) bool
    projection: torch.Tensor  # (D, k)
    mean: torch.Tensor  # (P, D)
    log_prior: torch.Tensor  # (P,)
    pooled: torch.Tensor  # (D, D)
    features: torch.Tensor  # (P · n, k)
    labels: torch.Tensor  # (P · n,) indices into the present classes


def _train(
    params: list[torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
) -> None:
    """AdamW over shuffled mini-batches of row indices (the authors' loop:
    no schedule, last batch kept)."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = loss_fn(idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> torch.Tensor:
    """nn.Linear's default initialisation, from ``generator``."""
    t = torch.rand(shape, generator=generator, dtype=torch.float64) * 2.0 - 1.0
    return (t * bound).requires_grad_()


def _scatter_rows(t: torch.Tensor, present: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Rows of the P present classes placed in a (C, …) tensor, ``fill`` elsewhere."""
    out = torch.full((len(present), *t.shape[1:]), fill, dtype=t.dtype)
    out[present] = t.detach()
    return out


def cosine_logits(z: torch.Tensor, weight: torch.Tensor, scale: float) -> torch.Tensor:
    """s · cos(z, w_c)."""
    return scale * F.normalize(z, dim=1) @ F.normalize(weight, dim=1).T


def fishermix_head(
    setup: LearnedSetup,
    *,
    scale: float,
    margin: float,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """FisherMix: class prototypes w_c in the Fisher subspace trained by
    cross-entropy on s · (cos(z, w_c) − m·[c = y]) (a CosFace margin) over the
    synthetic features; ``{"projection", "weight" (C, k), "bias" (C,), "scale"}``."""
    z, y = setup.features, setup.labels
    p, k = setup.mean.shape[0], z.shape[1]
    weight = (torch.randn(p, k, generator=generator, dtype=torch.float64) * 0.01).requires_grad_()
    onehot = F.one_hot(y, p).double()

    def loss(idx: torch.Tensor) -> torch.Tensor:
        logits = cosine_logits(z[idx], weight, scale) - scale * margin * onehot[idx]
        return F.cross_entropy(logits, y[idx])

    _train(
        [weight],
        loss,
        len(z),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        generator=generator,
    )
    return {
        "projection": setup.projection,
        "weight": _scatter_rows(weight, setup.present),
        "bias": _scatter_rows(
            torch.zeros(p, dtype=torch.float64), setup.present, ABSENT_CLASS_BIAS
        ),
        "scale": torch.tensor(float(scale), dtype=torch.float64),
    }


def fisher_gaussians(setup: LearnedSetup, shrinkage: float) -> dict[str, torch.Tensor]:
    """Proto-Hyper's two Fisher-space Gaussian heads' parameters: means μ_c V,
    Σ_f = Vᵀ shrink(Σ_W, λ) V + εI, LDA_f's (W_f, b_f) and NB_f's spherical
    variance σ² = tr Σ_f / k."""
    v = setup.projection
    k = v.shape[1]
    mean = setup.mean @ v
    cov = _sym(v.T @ shrink_to_identity(setup.pooled, shrinkage) @ v)
    cov = cov + JITTER * torch.eye(k, dtype=cov.dtype)
    w = torch.linalg.solve(cov + JITTER * torch.eye(k, dtype=cov.dtype), mean.T)  # (k, P)
    b = -0.5 * (mean * w.T).sum(1) + setup.log_prior
    sigma2 = max(float(cov.diagonal().sum()) / k, 1e-12)
    sigma2_t = torch.tensor(sigma2, dtype=torch.float64)  # float64 like the rest
    return {"mean": mean, "lda_weight": w, "lda_bias": b, "sigma2": sigma2_t}


def nb_fisher_logits(
    z: torch.Tensor, mean: torch.Tensor, log_prior: torch.Tensor, sigma2: torch.Tensor
) -> torch.Tensor:
    """NB_f(z) = log π_c − ‖z − m_c‖² / (2σ²) − (k/2) log σ²."""
    k = z.shape[1]
    dist = (z[:, None, :] - mean[None]).square().sum(-1)
    return log_prior - 0.5 * dist / sigma2 - 0.5 * k * torch.log(sigma2)


def protohyper_head(
    setup: LearnedSetup,
    *,
    shrinkage: float,
    rank: int,
    teacher_blend: float,
    kd_alpha: float,
    temperature: float,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Proto-Hyper: student NB_f(z) + B(A z) + c (A (r, k), B (P, r)) distilled
    from the teacher β·LDA_f + (1 − β)·NB_f on the synthetic features with
    α T² KL(teacher_T ‖ student_T) + (1 − α) CE; ``{"projection", "mean",
    "log_prior", "sigma2", "down", "up", "bias"}`` (absent classes: the
    log prior no score reaches, zero residual)."""
    z, y = setup.features, setup.labels
    g = fisher_gaussians(setup, shrinkage)
    p, k = setup.mean.shape[0], z.shape[1]
    r = min(rank, k)
    base = nb_fisher_logits(z, g["mean"], setup.log_prior, g["sigma2"])
    teacher = teacher_blend * (z @ g["lda_weight"] + g["lda_bias"]) + (1 - teacher_blend) * base
    soft = F.softmax(teacher / temperature, dim=1)
    down = _uniform((r, k), 1 / math.sqrt(k), generator)
    up = _uniform((p, r), 1 / math.sqrt(r), generator)
    bias = _uniform((p,), 1 / math.sqrt(r), generator)

    def loss(idx: torch.Tensor) -> torch.Tensor:
        student = base[idx] + (z[idx] @ down.T) @ up.T + bias
        ce = F.cross_entropy(student, y[idx])
        if kd_alpha <= 0:
            return ce
        kl = F.kl_div(F.log_softmax(student / temperature, 1), soft[idx], reduction="batchmean")
        return kd_alpha * temperature**2 * kl + (1 - kd_alpha) * ce

    _train(
        [down, up, bias],
        loss,
        len(z),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        generator=generator,
    )
    present = setup.present
    return {
        "projection": setup.projection,
        "mean": _scatter_rows(g["mean"], present),
        "log_prior": _scatter_rows(setup.log_prior, present, ABSENT_CLASS_BIAS),
        "sigma2": g["sigma2"].double(),
        "down": down.detach(),
        "up": _scatter_rows(up, present),
        "bias": _scatter_rows(bias, present),
    }


class FisherMixHead(nn.Module):
    """s · cos(f V, w_c) + b_c on the global token, float64 (no margin at test time)."""

    def __init__(
        self,
        projection: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        scale: torch.Tensor,
    ):
        super().__init__()
        self.register_buffer("projection", projection.double())
        self.register_buffer("weight", weight.double())
        self.register_buffer("bias", bias.double())
        self.register_buffer("scale", scale.double())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = tokens[:, 0] if tokens.ndim == 3 else tokens
        z = f.double() @ self.projection
        return cosine_logits(z, self.weight, float(self.scale)) + self.bias


class ProtoHyperHead(nn.Module):
    """NB_f(f V) + B(A f V) + c on the global token, float64 (the student only)."""

    def __init__(
        self,
        projection: torch.Tensor,
        mean: torch.Tensor,
        log_prior: torch.Tensor,
        sigma2: torch.Tensor,
        down: torch.Tensor,
        up: torch.Tensor,
        bias: torch.Tensor,
    ):
        super().__init__()
        for name, t in (
            ("projection", projection),
            ("mean", mean),
            ("log_prior", log_prior),
            ("sigma2", sigma2),
            ("down", down),
            ("up", up),
            ("bias", bias),
        ):
            self.register_buffer(name, t.double())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = tokens[:, 0] if tokens.ndim == 3 else tokens
        z = f.double() @ self.projection
        base = nb_fisher_logits(z, self.mean, self.log_prior, self.sigma2)
        return base + (z @ self.down.T) @ self.up.T + self.bias
