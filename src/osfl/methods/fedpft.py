"""FedPFT: per-class Gaussian mixtures of frozen-encoder features, sampled on
the server to train a linear head.

Beitollahi et al., "Parametric Feature Transfer: One-shot Federated Learning
with Foundation Models" (FedPFT, 2024; code: Flower ``baselines/fedpft``,
``utils.learn_gmm`` and ``strategy.FedPFT.aggregate_fit``), a FALCON baseline
(Liu et al., 2025, Table 2, with K = 20 diagonal components). Each client
encodes its images once (:mod:`osfl.methods.frozen`), fits for every class c
it holds a scikit-learn ``GaussianMixture(covariance_type="diag")``, seeded,
and uploads its weights, means and variances in float16 with the class
count n_c; the server draws n_c features from every (client, class) mixture
and trains a linear head with AdamW on them.

Classes smaller than K. The official code fits only classes with n_c > K
and silently drops the others (under Dirichlet α = 0.1 that is most of a
client's classes). Here (``small_classes="fewer"``, the default) a class
with 2 ≤ n_c ≤ K gets min(K, n_c) components and a class with one sample
gets one component centred on it whose variance is the client's pooled
within-class variance (floored at ``reg_covar``). Both put components on
real features when n_c ≤ K (a mixture with as many components as points
memorises them), so ``small_classes="drop"`` reproduces the official
behaviour for published numbers and for privacy. An empty class uploads
nothing.

Wire format: one float16 tensor ``gmm.<c>`` of shape (k_c, 1 + 2D) per class
sent, rows [weight, mean (D), variance (D)] — one tensor per class, so its
components cannot disagree in number — and ``meta.class_counts``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import MethodCard, Predictor, Reporting, SiteEvaluation, register_method
from osfl.fl.seeds import derive_seed
from osfl.fl.tensor_fit import FitConfig, fit
from osfl.fl.upload import NUM_SAMPLES, Broadcast, MetaSpec, TensorSpec, Upload, UploadSpec
from osfl.methods.frozen.base import (
    TINY_VIT_SMOKE,
    FrozenEncoderMethod,
    TokenPredictor,
    flops_per_sample,
    part_bytes,
)
from osfl.methods.frozen.encoder import EncoderConfig

__all__ = ["FedPFT", "FedPFTConfig", "LinearTokenHead", "fit_class_gmm", "sample_gmm_rows"]

#: one mixture fit at a time silences its convergence warnings (see fit_class_gmm)
_SILENCED_FITS = threading.Lock()

log = logging.getLogger(__name__)

SMALL_CLASSES = ("fewer", "drop")


def _server_fit() -> FitConfig:
    """Flower's FedPFT strategy: AdamW (torch defaults, weight decay 0.01),
    lr 1e-4, batch 32, 50 epochs (caltech-fedpft.toml)."""
    return FitConfig(epochs=50, batch_size=32, optimizer="adamw", lr=1e-4, weight_decay=0.01)


@dataclass(frozen=True)
class FedPFTConfig:
    """FedPFT's options (see docs/methods/fedpft.md). ``tol``/``max_iter``:
    EM stopping as the Flower baseline's ``learn_gmm`` defaults (1e-12, 1000
    iterations; its strategy config passes 10000)."""

    #: Gaussian components per class and client
    components: int = 20
    #: classes with fewer samples than components: fewer (fit fewer components) or drop (the
    #: official code)
    small_classes: str = "fewer"
    #: variance floor of the mixtures
    reg_covar: float = 1e-6
    #: EM convergence tolerance
    tol: float = 1e-12
    #: most EM iterations
    max_iter: int = 1000
    #: how the server trains the head on sampled features
    server_fit: FitConfig = field(default_factory=_server_fit)
    #: how the frozen encoder runs
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    def __post_init__(self) -> None:
        if self.components < 1:
            raise ConfigError(f"components must be >= 1, got {self.components}")
        if self.small_classes not in SMALL_CLASSES:
            raise ConfigError(
                f"small_classes must be one of {', '.join(SMALL_CLASSES)}, "
                f"got {self.small_classes!r}"
            )
        if self.reg_covar <= 0 or self.tol <= 0 or self.max_iter < 1:
            raise ConfigError("reg_covar and tol must be > 0 and max_iter >= 1")


def fit_class_gmm(
    features: np.ndarray,
    k: int,
    *,
    seed: int,
    reg_covar: float,
    tol: float,
    max_iter: int,
    single_variance: np.ndarray,
) -> np.ndarray:
    """Rows [weight, mean, variance] (k', 1 + 2D) float64 of a diagonal GMM with
    k' = min(k, n) components fitted to ``features`` (n, D); one sample gets
    one component at it with ``single_variance``."""
    n = features.shape[0]
    if n == 1:
        return np.concatenate([[1.0], features[0], single_variance])[None]
    # heavy: scikit-learn (~1 s; only FedPFT's client fit needs it)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture  # heavy: scikit-learn

    gmm = GaussianMixture(
        n_components=min(k, n),
        covariance_type="diag",
        reg_covar=reg_covar,
        tol=tol,
        max_iter=max_iter,
        random_state=seed,
    )
    # reported once per fit below, not as a warning storm; under a lock because
    # catch_warnings swaps the process-wide filter list, and clients fitting in
    # threads (parallel_clients) would otherwise restore each other's mid-fit
    with _SILENCED_FITS, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm.fit(features)
    if not gmm.converged_:
        log.info(
            "fedpft: EM stopped at max_iter=%d before tol=%g (n=%d, k=%d)",
            max_iter,
            tol,
            n,
            gmm.n_components,
        )
    return np.concatenate([gmm.weights_[:, None], gmm.means_, gmm.covariances_], axis=1)


def pooled_variance(features: np.ndarray, labels: np.ndarray, floor: float) -> np.ndarray:
    """Per-dimension within-class variance pooled over the classes with ≥ 2
    samples (the client's best guess of a class's spread), floored."""
    num = np.zeros(features.shape[1])
    dof = 0
    for c in np.unique(labels):
        f = features[labels == c]
        if len(f) > 1:
            num += ((f - f.mean(0)) ** 2).sum(0)
            dof += len(f) - 1
    return np.maximum(num / dof if dof else np.zeros_like(num), floor)


def sample_gmm_rows(
    rows: torch.Tensor, n: int, generator: torch.Generator, floor: float
) -> torch.Tensor:
    """``n`` float32 draws from a GMM given as rows [weight, mean, variance]
    (negative or all-zero weights fall back to uniform, variances below
    ``floor`` are raised to it: the server reads any valid upload)."""
    rows = rows.float()
    d = (rows.shape[1] - 1) // 2
    w = rows[:, 0].clamp(min=0)
    w = w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, 1.0 / len(w))
    mean, var = rows[:, 1 : 1 + d], rows[:, 1 + d :].clamp(min=floor)
    comp = torch.multinomial(w, n, replacement=True, generator=generator)
    eps = torch.randn(n, d, generator=generator)
    return mean[comp] + eps * var[comp].sqrt()


class LinearTokenHead(nn.Module):
    """A linear head on the global token (B, V, D) -> (B, C)."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear(tokens[:, 0] if tokens.ndim == 3 else tokens)


@register_method("fedpft")
class FedPFT(FrozenEncoderMethod, SiteEvaluation, Reporting):
    """Server state: ``{"encoder", "head", "clients": {id: {bytes, num_samples,
    classes_sent}}, "gflops_per_sample"}``."""

    Config: ClassVar[type] = FedPFTConfig
    trains_with_recipe: ClassVar[bool] = False  # its own fit: server_fit
    card: ClassVar[MethodCard] = dataclasses.replace(
        FrozenEncoderMethod.card,
        summary=(
            "Clients of a frozen encoder send per-class Gaussian mixtures of their features; the "
            "server trains a head on samples."
        ),
        paper=(
            'Beitollahi et al., "Parametric Feature Transfer: One-shot Federated Learning with '
            'Foundation Models", 2024'
        ),
        smoke=(
            *TINY_VIT_SMOKE,
            "method.fedpft.components=3",
            "method.fedpft.max_iter=50",
            "method.fedpft.tol=0.001",
            "method.fedpft.server_fit={epochs: 20, batch_size: 128, lr: 0.01}",
        ),
    )

    config: FedPFTConfig

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        encoder = self.check_broadcast(ctx, broadcast)
        feats = self.client_tokens(ctx, data, encoder)[:, 0].double().numpy()
        labels = data.labels.numpy()
        cfg = self.config
        single = pooled_variance(feats, labels, cfg.reg_covar)
        counts = np.bincount(labels, minlength=self.run.num_classes)
        tensors = {}
        for c in np.flatnonzero(counts):
            if cfg.small_classes == "drop" and counts[c] <= cfg.components:
                continue
            rows = fit_class_gmm(
                feats[labels == c],
                cfg.components,
                seed=derive_seed(self.run.seed, "fedpft-gmm", ctx.client_id, int(c)) % 2**32,
                reg_covar=cfg.reg_covar,
                tol=cfg.tol,
                max_iter=cfg.max_iter,
                single_variance=single,
            )
            # numpy rounds float64 to float16 once, correctly; torch's cast goes
            # through float32 on some CPU kernel paths (a double rounding that
            # moves a value next to a float16 tie by one step, e.g. on oneDNN
            # AVX2), so the upload would depend on the machine
            tensors[f"gmm.{int(c)}"] = torch.from_numpy(rows.astype(np.float16))
        meta = {"num_samples": len(data), "class_counts": [int(n) for n in counts]}
        return Upload(tensors=tensors, meta=meta)

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        c, d = self.run.num_classes, self.token_dim()
        return UploadSpec(
            optional={f"gmm.{k}": TensorSpec((None, 1 + 2 * d), torch.float16) for k in range(c)},
            meta={
                "num_samples": NUM_SAMPLES,
                "class_counts": MetaSpec("int_list", low=0, length=c, sum_of="num_samples"),
            },
        )

    def synthetic_features(
        self, uploads: Mapping[int, Upload]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """n_c draws from every (client, class) mixture sent, with labels."""
        xs, ys = [], []
        for cid in sorted(uploads):
            up = uploads[cid]
            for k, n in enumerate(up.meta["class_counts"]):
                rows = up.tensors.get(f"gmm.{k}")
                if rows is None or n == 0 or len(rows) == 0:
                    continue
                g = torch.Generator().manual_seed(
                    derive_seed(self.run.seed, "fedpft-sample", cid, k)
                )
                xs.append(sample_gmm_rows(rows, n, g, self.config.reg_covar))
                ys.append(torch.full((n,), k, dtype=torch.int64))
        if not xs:
            raise ConfigError(
                "fedpft: no client sent a mixture (with small_classes='drop' every class "
                f"needs more than components={self.config.components} samples)"
            )
        return torch.cat(xs), torch.cat(ys)

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        x, y = self.synthetic_features(uploads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, "fedpft-head-init"))
            head = LinearTokenHead(self.token_dim(), self.run.num_classes)
        fit(
            head,
            [x, y],
            lambda m, xb, yb: F.cross_entropy(m(xb), yb),
            self.config.server_fit,
            generator=torch.Generator().manual_seed(derive_seed(self.run.seed, "fedpft-server")),
            device=self.run.device,
            progress=self.run.progress,
            description="fedpft: server head",
        )
        clients = {
            c: {
                "num_samples": uploads[c].meta["num_samples"],
                "classes_sent": sorted(int(k.split(".")[1]) for k in uploads[c].tensors),
                "bytes": part_bytes(uploads[c], {"gmms": lambda k: k.startswith("gmm.")}),
            }
            for c in sorted(uploads)
        }
        return {
            "encoder": state["encoder"],
            "head": {k: v.detach().cpu() for k, v in head.state_dict().items()},
            "clients": clients,
            "gflops_per_sample": self.generation_gflops(),
        }

    def generation_gflops(self) -> float:
        """GFLOPs per synthetic feature of GMM sampling, by FlopCounterMode:
        0, since drawing from a diagonal mixture is elementwise work (about
        3·D flops per feature) that the counter does not count."""
        d, k = self.token_dim(), self.config.components
        rows = torch.cat([torch.full((k, 1), 1.0 / k), torch.zeros(k, d), torch.ones(k, d)], 1)
        g = torch.Generator().manual_seed(0)
        return round(flops_per_sample(lambda: sample_gmm_rows(rows, 64, g, 1e-6)), 6)

    def predictor(self, state: dict[str, Any]) -> Predictor:
        head = LinearTokenHead(self.token_dim(), self.run.num_classes)
        head.load_state_dict(state["head"])
        return TokenPredictor(self.encoder(), self.view_sets(), head.eval())

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"head": state["head"]}  # not the clients' mixtures

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Encoder identity, bytes up per client (GMMs), classes each client
        sent a mixture for, GFLOPs per synthetic feature."""
        clients = state.get("clients", {})
        return {
            "encoder": state["encoder"],
            "bytes_up": {str(c): v["bytes"] for c, v in clients.items()},
            "classes_sent": {str(c): v["classes_sent"] for c, v in clients.items()},
            "gflops_per_sample": state.get("gflops_per_sample"),
            "small_classes": self.config.small_classes,
        }
