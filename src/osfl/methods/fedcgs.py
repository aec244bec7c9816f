"""FedCGS: a closed-form Gaussian (LDA) head from federated feature statistics.

Guan, Zhou & Gu, "Capture Global Feature Statistics for One-Shot Federated
Learning" (AAAI 2025, the method FedCGS; code
github.com/Yuqin-G/FedCGS, ``main_fedcgs.py`` / ``utils_fl.eval``), a
FALCON baseline (Liu et al., 2025, Table 2). Each client runs the frozen
encoder (:mod:`osfl.methods.frozen`) over its images and uploads, in
float64, its per-class feature sums S_c, per-class counts n_c and the
second moment B = Σ f fᵀ. The server adds them up — sums are additive, so
the result does not depend on how the data were split — and writes the
shared-covariance Gaussian classifier into a linear head, without training:

    N = Σ n_c,  A = Σ_c S_c,  μ = A / N,  μ_c = S_c / n_c,
    Σ = (B − μAᵀ − Aμᵀ + Nμμᵀ) / (N − 1)        (FedCGS: the total covariance)
    W_c = μ_cᵀ Σ̂⁻¹,  b_c = −½ μ_cᵀ Σ̂⁻¹ μ_c + log(n_c / N)

Σ̂ = Σ + λ·(tr Σ / D)·I is a stated, scale-free ridge (``shrinkage`` = λ;
λ·I when every feature is the same, tr Σ = 0):
the public code inverts Σ as it is (γ = 0), which fails for D > N or
collinear features; Ledoit–Wolf's data-driven intensity needs fourth
moments of the features that these statistics do not hold. The client does
not send A: it is exactly Σ_c S_c, so sending it only adds D·8 bytes and a
way to be inconsistent. ``covariance="within"`` uses the textbook LDA
pooled within-class covariance (B − Σ_c n_c μ_c μ_cᵀ)/(N − C) instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import (
    MethodCard,
    Predictor,
    Reporting,
    Screening,
    SiteEvaluation,
    register_method,
)
from osfl.fl.upload import NUM_SAMPLES, Broadcast, MetaSpec, TensorSpec, Upload, UploadSpec
from osfl.methods.frozen.base import (
    TINY_VIT_SMOKE,
    FrozenEncoderMethod,
    TokenPredictor,
    part_bytes,
)
from osfl.methods.frozen.encoder import EncoderConfig

__all__ = [
    "COVARIANCES",
    "FedCGS",
    "FedCGSConfig",
    "GaussianHead",
    "client_statistics",
    "lda_head",
    "statistics_problem",
]

COVARIANCES = ("total", "within")
#: The bias of a class no client holds: never predicted, still a finite number.
ABSENT_CLASS_BIAS = -1e30
#: The largest statistic accepted: sums of 10⁷ such values and their products
#: stay far inside float64 (a client cannot overflow the server's covariance).
MAX_STATISTIC = 1e100


@dataclass(frozen=True)
class FedCGSConfig:
    """FedCGS's options (see docs/methods/fedcgs.md)."""

    #: ridge added to the covariance before it is inverted
    shrinkage: float = 1e-4
    #: covariance of the Gaussian head: total (FedCGS) or within (textbook LDA)
    covariance: str = "total"
    #: how the frozen encoder runs
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    def __post_init__(self) -> None:
        if not self.shrinkage >= 0.0:
            raise ConfigError(f"shrinkage must be >= 0, got {self.shrinkage}")
        if self.covariance not in COVARIANCES:
            raise ConfigError(
                f"covariance must be one of {', '.join(COVARIANCES)}, got {self.covariance!r}"
            )


def client_statistics(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> dict[str, torch.Tensor]:
    """A client's float64 ``class_sums`` (C, D), ``class_counts`` (C,) int64
    and ``second_moment`` (D, D) = Σ f fᵀ of its features (N, D)."""
    f = features.double()
    sums = torch.zeros(num_classes, f.shape[1], dtype=torch.float64)
    sums.index_add_(0, labels, f)
    return {
        "class_sums": sums,
        "class_counts": torch.bincount(labels, minlength=num_classes),
        "second_moment": f.T @ f,
    }


def statistics_problem(
    class_sums: torch.Tensor, class_counts: list[int], second_moment: torch.Tensor
) -> str | None:
    """Why one client's statistics cannot come from any features (``None``:
    they can). Real ones satisfy: no sum for a class without samples; every
    value within :data:`MAX_STATISTIC`; B symmetric; and the client's
    within-class scatter B − Σ_c S_c S_cᵀ / n_c positive semi-definite
    (Cauchy–Schwarz). The last makes the server's pooled covariance PSD
    whatever the clients' split, so the closed-form head exists."""
    n_c = torch.tensor(class_counts, dtype=torch.float64)
    if bool((class_sums[n_c == 0] != 0).any()):
        return "class_sums: a nonzero sum for a class with no samples"
    for name, t in (("class_sums", class_sums), ("second_moment", second_moment)):
        if bool((t.abs() > MAX_STATISTIC).any()):
            return f"{name}: values beyond {MAX_STATISTIC:g}"
    scale = float(second_moment.diagonal().abs().sum()) + 1.0
    if float((second_moment - second_moment.T).abs().max()) > 1e-9 * scale:
        return "second_moment is not symmetric"
    held = n_c > 0
    outer = class_sums[held].T @ (class_sums[held] / n_c[held, None])
    scatter = 0.5 * ((second_moment - outer) + (second_moment - outer).T)
    low = float(torch.linalg.eigvalsh(scatter)[0])
    if low < -1e-8 * scale:
        return "second_moment is smaller than the class sums allow (not Σ f fᵀ of any features)"
    return None


def lda_head(
    class_sums: torch.Tensor,
    class_counts: torch.Tensor,
    second_moment: torch.Tensor,
    *,
    shrinkage: float,
    covariance: str = "total",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W (C, D), b (C,))`` float64 of the shared-covariance Gaussian
    classifier (module docstring); absent classes get W = 0 and a bias no
    score reaches."""
    n_c = class_counts.double()
    n = float(n_c.sum())
    present = n_c > 0
    d = class_sums.shape[1]
    b2 = 0.5 * (second_moment + second_moment.T)  # exact symmetry before solving
    mu_c = torch.where(present[:, None], class_sums / n_c.clamp(min=1)[:, None], 0.0)
    if n < 2:  # one sample (a lone client's claim): no spread to estimate
        sigma = torch.zeros(d, d, dtype=torch.float64)
    elif covariance == "total":
        a = class_sums.sum(0)
        mu = a / n
        sigma = (b2 - torch.outer(mu, a) - torch.outer(a, mu) + n * torch.outer(mu, mu)) / (n - 1)
    else:
        dof = n - int(present.sum())  # < 1: one sample per class, no spread to estimate
        scatter = b2 - (n_c[:, None, None] * mu_c[:, :, None] * mu_c[:, None, :]).sum(0)
        sigma = scatter / dof if dof >= 1 else torch.zeros_like(b2)
    spread = float(torch.trace(sigma)) / d
    ridge = shrinkage * (spread if spread > 0 else 1.0)  # all features equal: a unit ridge
    sigma_hat = sigma + ridge * torch.eye(d, dtype=torch.float64)
    eig = torch.linalg.eigvalsh(sigma_hat)
    if not float(eig[0]) > d * torch.finfo(torch.float64).eps * float(eig[-1].abs()):
        raise ConfigError(
            "fedcgs: the feature covariance is singular (fewer samples than feature "
            "dimensions, or collinear features); raise method.fedcgs.shrinkage "
            f"(now {shrinkage})"
        )
    w = torch.linalg.solve(sigma_hat, mu_c.T).T  # μ_c Σ̂⁻¹ (Σ̂ symmetric)
    prior = torch.log(n_c.clamp(min=1) / n)
    b = -0.5 * (mu_c * w).sum(1) + prior
    b = torch.where(present, b, torch.full_like(b, ABSENT_CLASS_BIAS))
    return w, b


class GaussianHead(nn.Module):
    """The closed-form head on the global token, evaluated in float64 (so
    partitions of the same data give the same scores to ~1e-12)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight.double())
        self.register_buffer("bias", bias.double())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = tokens[:, 0] if tokens.ndim == 3 else tokens
        return f.double() @ self.weight.T + self.bias


@register_method("fedcgs")
class FedCGS(FrozenEncoderMethod, Screening, SiteEvaluation, Reporting):
    """Server state: ``{"encoder", "weight", "bias", "clients": {id: {bytes, num_samples}}}``."""

    Config: ClassVar[type] = FedCGSConfig
    trains_with_recipe: ClassVar[bool] = False  # closed form: nothing trains by gradient
    card: ClassVar[MethodCard] = dataclasses.replace(
        FrozenEncoderMethod.card,
        summary=(
            "Clients of a frozen encoder send feature sums; the server writes a closed-form "
            "Gaussian (LDA) classifier."
        ),
        paper=(
            'Guan, Zhou & Gu, "FedCGS: Leverage Feature Compression for Conditional Gaussian '
            'Sampling in One-shot Federated Learning", 2025'
        ),
        smoke=TINY_VIT_SMOKE,
    )

    config: FedCGSConfig

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        encoder = self.check_broadcast(ctx, broadcast)
        features = self.client_tokens(ctx, data, encoder)[:, 0]
        stats = client_statistics(features, data.labels, self.run.num_classes)
        counts = [int(n) for n in stats.pop("class_counts")]
        return Upload(tensors=stats, meta={"num_samples": len(data), "class_counts": counts})

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        c, d = self.run.num_classes, self.token_dim()
        return UploadSpec(
            tensors={
                "class_sums": TensorSpec((c, d), torch.float64),
                "second_moment": TensorSpec((d, d), torch.float64),
            },
            meta={
                "num_samples": NUM_SAMPLES,
                "class_counts": MetaSpec("int_list", low=0, length=c, sum_of="num_samples"),
            },
        )

    def screen(self, state: dict[str, Any], round: int, client: int, upload: Upload) -> str | None:
        """Statistics no set of features can produce are refused
        (:func:`statistics_problem`): they could only break the server's solve."""
        t = upload.tensors
        return statistics_problem(t["class_sums"], upload.meta["class_counts"], t["second_moment"])

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        ids = sorted(uploads)
        sums = sum(uploads[c].tensors["class_sums"] for c in ids)
        second = sum(uploads[c].tensors["second_moment"] for c in ids)
        counts = torch.tensor(
            [
                sum(uploads[c].meta["class_counts"][k] for c in ids)
                for k in range(self.run.num_classes)
            ]
        )
        w, b = lda_head(
            sums, counts, second, shrinkage=self.config.shrinkage, covariance=self.config.covariance
        )
        clients = {
            c: {
                "num_samples": uploads[c].meta["num_samples"],
                "bytes": part_bytes(uploads[c], {"statistics": lambda k: True}),
            }
            for c in ids
        }
        return {"encoder": state["encoder"], "weight": w, "bias": b, "clients": clients}

    def predictor(self, state: dict[str, Any]) -> Predictor:
        head = GaussianHead(state["weight"], state["bias"])
        return TokenPredictor(self.encoder(), self.view_sets(), head)

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"weight": state["weight"], "bias": state["bias"]}

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Encoder identity, bytes up per client (all statistics), no generation."""
        clients = state.get("clients", {})
        return {
            "encoder": state["encoder"],
            "bytes_up": {str(c): v["bytes"] for c, v in clients.items()},
            "gflops_per_sample": None,
            "ridge": self.config.shrinkage,
            "covariance": self.config.covariance,
        }
