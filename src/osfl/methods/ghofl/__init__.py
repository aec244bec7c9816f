"""GH-OFL: Gaussian heads (NB / LDA / QDA) and the learned FisherMix and
Proto-Hyper heads, all from per-class feature moments.

Turazza, Picone & Mamei, "The Gaussian-Head OFL Family: One-Shot Federated
Learning from Client Global Statistics" (ICLR 2026, arXiv 2602.01186); the
authors' code: github.com/FabioTur-dev/One-Shot-FL (``server/GH_OFL_server.py``
and the README's example CIFAR-10 config, 2026-03 "camera-ready"). Clients of a
frozen pretrained encoder send once their per-class counts and first and
second moments; the server builds (i) closed-form heads, (ii) FisherMix, a
cosine-margin linear head trained on synthetic features drawn in an estimated
Fisher subspace, and (iii) Proto-Hyper, a low-rank residual head refining
Gaussian logits by distillation on those features. Built on the
frozen-encoder layer shared with FedCGS (:mod:`osfl.methods.fedcgs`,
:mod:`osfl.methods.frozen`).

Client k sends, in float64, for every class c: the count n_c (typed
metadata, summing to ``num_samples``), the feature sum S_c = Σ_{y=c} f and the
second moment the chosen head needs:

    qda, fishermix, protohyper: B_c = Σ_{y=c} f fᵀ (C, D, D)
    nb: Q_c = Σ_{y=c} f ⊙ f (C, D)      lda: B = Σ_c B_c (D, D) (FedCGS's upload)

The server adds them over clients, and with N = Σ n_c, K the number of
classes some client holds, π_c = n_c / N, μ_c = S_c / n_c, M_c = B_c − n_c μ_c μ_cᵀ:

    Σ_c = M_c / (n_c − 1)   (Σ_W when n_c < 2)      Σ_W = Σ_c M_c / (N − K)
    shrink(Σ, λ) = (1 − λ) Σ + λ (tr Σ / D) I        (the authors' shrink_cov)
    Σ̂_c = shrink((1 − α) Σ_c + α Σ_W, λ) + r I       (α = ``pooling``, r = ridge·tr Σ_W / D)
    qda / nb:  g_c(f) = log π_c − ½ log det Σ̂_c − ½ (f − μ_c)ᵀ Σ̂_c⁻¹ (f − μ_c) − (D/2) log 2π
    lda:       g_c(f) = μ_cᵀ Σ̂⁻¹ f − ½ μ_cᵀ Σ̂⁻¹ μ_c + log π_c,  Σ̂ = shrink(Σ_W, λ) + r I

with λ = ``qda_shrinkage`` / ``nb_shrinkage`` / ``shrinkage`` (lda) and nb on
diagonals only. Every statistic is a sum, so these heads do not depend on how
the data were split. The learned heads (:mod:`.learned`) go on:

    S_B = Σ π_c (μ_c − μ̄)(μ_c − μ̄)ᵀ,  S_W = shrink(Σ_W, λ) + εI,  ε = 1e-6
    V = S_W^{-1/2} U_k   (U: eigenvectors of S_W^{-1/2} S_B S_W^{-1/2}, k the fewest
                          holding ``fisher_energy`` of its spectrum, 2 ≤ k ≤ ``fisher_max_dim``)
    z ~ N(μ_c V, τ² (Vᵀ shrink(Σ_c, λ_s) V + εI) + εI), ``synthetic_per_class`` per class
    FisherMix:   CE of s·(cos(z, w_c) − m·[c = y]);  test logits s·cos(f V, w_c)
    Proto-Hyper: student NB_f(z) + B A z + b,  NB_f(z) = log π_c − ‖z − μ_c V‖²/(2σ²) − (k/2) log σ²,
                 σ² = tr Σ_f / k, Σ_f = Vᵀ shrink(Σ_W, λ) V + εI; teacher β LDA_f + (1 − β) NB_f
                 (LDA_f: the lda head on (μ_c V, Σ_f)); loss α T² KL(teacher_T ‖ student_T) + (1 − α) CE

trained with AdamW on shuffled mini-batches. Sampling, initialisation and
shuffling use one generator seeded from the run seed, all in float64, so with
a fixed seed the learned heads depend on the data only through the summed
statistics: two partitions of the same data give the same synthetic features
and the same head up to float rounding (tested). A class no client holds
scores :data:`~osfl.methods.fedcgs.ABSENT_CLASS_BIAS` (finite, never
predicted) and gets no synthetic features.

What differs from the paper, and why:

- **Sources.** The paper's body could not be read here (only its abstract and
  introduction); the equations above follow the authors' public code, whose
  versions disagree. We take the README's CIFAR-10 example config for every
  default and the 2026-03 server for Proto-Hyper (NB_f base, teacher
  0.7·LDA_f + 0.3·NB_f). For FisherMix that server trains a plain linear
  head; the abstract says "linear head with cosine margin" and the 2026-02
  server trains a CosFace-style cosine head, so ours is that head, with the
  scale 30 and margin 0.05 the 2026-03 server still lists (its 2026-02
  defaults were 20 and 0). The 2026-02 Proto-Hyper (standardised LDA_f base,
  QDA_f/LDA_f teacher) is not built.
- **Our additions, off by default:** ``ridge`` (a scale-free r I, FedCGS's
  regulariser) and ``pooling`` (Friedman's RDA blend toward Σ_W); both are
  sums-only, so they keep the partition invariance.
- **Small numeric choices.** The authors' nb uses the biased variance
  (÷ n_c) floored at 1e-6, ours the unbiased one (÷ (n_c − 1)), regularised
  like the others; they divide Σ_W by N − C (all classes), we by N − K
  (classes present: equal when every class is held); they add 1e-6·I to the
  x-space lda/qda covariances (ours: ``ridge``); an absent class gets prior
  1e-12 and still receives synthetic features there, here it is never
  predicted and gets none. Their Fisher eigenvectors carry eigh's arbitrary
  sign; ours are sign-fixed so rounding cannot flip them.
- **Uploads follow the head.** The paper's clients send all moments; here a
  run sends what its head needs (qda and the learned heads:
  (C·D + C·D²)·8 bytes, nb: 2·C·D·8, lda: (C·D + D²)·8), so byte tables
  compare heads honestly. The random-projection sketch the paper uses for
  some encoders (its "RP" clients) is not applied: QDA's C·D² grows with the
  encoder width, 45 MiB per client for C = 10, D = 768.
- **Default head ``qda``**: the most expressive closed-form head, and exactly
  partition invariant; which head the paper ranks first is not known here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import NUM_SAMPLES, Broadcast, MetaSpec, TensorSpec, Upload, UploadSpec
from osfl.methods.fedcgs import GaussianHead
from osfl.methods.frozen.base import FrozenEncoderMethod, TokenPredictor, part_bytes
from osfl.methods.frozen.encoder import EncoderConfig
from osfl.methods.ghofl.closed_form import (
    MOMENT_KEYS,
    GaussianClassHead,
    class_gaussians,
    class_moments,
    gaussian_head,
    moments_problem,
)
from osfl.methods.ghofl.learned import (
    SYNTHETIC_COVARIANCES,
    FisherMixHead,
    LearnedSetup,
    ProtoHyperHead,
    fisher_subspace,
    fishermix_head,
    protohyper_head,
    synthesize,
    synthetic_gaussians,
)

__all__ = [
    "GHOFL",
    "HEADS",
    "MOMENT_KEYS",
    "FisherMixHead",
    "GHOFLConfig",
    "GaussianClassHead",
    "ProtoHyperHead",
    "class_moments",
    "gaussian_head",
    "learned_setup",
    "moments_problem",
]

CLOSED_FORM = ("nb", "lda", "qda")
LEARNED = ("fishermix", "protohyper")
HEADS = CLOSED_FORM + LEARNED


@dataclass(frozen=True)
class GHOFLConfig:
    """GH-OFL's options (see docs/methods/ghofl.md); defaults: the authors'
    CIFAR-10 config, except ``ridge`` and ``pooling`` (ours, off)."""

    #: server head: nb, lda, qda (closed form) or fishermix, protohyper (learned)
    head: str = "qda"
    #: covariance shrinkage for lda, the Fisher subspace and Proto-Hyper
    shrinkage: float = 0.05  # lda, and S_W of the Fisher subspace and of Proto-Hyper's Σ_f
    #: covariance shrinkage of qda's per-class covariances
    qda_shrinkage: float = 0.1
    #: variance shrinkage of nb
    nb_shrinkage: float = 0.0
    #: extra ridge on the within-class covariance, relative to its trace (0: off; ours)
    ridge: float = 0.0
    #: blend of nb's and qda's class covariances toward the pooled one (0: off; ours)
    pooling: float = 0.0
    #: share of the between-class spectrum the Fisher subspace keeps
    fisher_energy: float = 0.995
    #: most dimensions of the Fisher subspace
    fisher_max_dim: int = 16
    #: synthetic features drawn per class for the learned heads
    synthetic_per_class: int = 4000
    #: standard-deviation scale of the synthetic features
    synthetic_scale: float = 0.9  # τ
    #: shrinkage of the covariance the synthetic features are drawn from
    synthetic_shrinkage: float = 0.05
    #: that covariance: class (each class's own) or pooled
    synthetic_covariance: str = "class"
    #: scale s of FisherMix's cosine-margin loss
    fishermix_scale: float = 30.0
    #: margin m of FisherMix's cosine-margin loss
    fishermix_margin: float = 0.05
    #: FisherMix training epochs
    fishermix_epochs: int = 40
    #: FisherMix batch size
    fishermix_batch_size: int = 2048
    #: FisherMix AdamW learning rate
    fishermix_lr: float = 8e-4
    #: FisherMix AdamW weight decay
    fishermix_weight_decay: float = 3e-4
    #: rank of Proto-Hyper's low-rank residual
    protohyper_rank: int = 16
    #: Proto-Hyper training epochs
    protohyper_epochs: int = 40
    #: Proto-Hyper batch size
    protohyper_batch_size: int = 1024
    #: Proto-Hyper AdamW learning rate
    protohyper_lr: float = 1e-3
    #: Proto-Hyper AdamW weight decay
    protohyper_weight_decay: float = 5e-4
    #: weight of Proto-Hyper's distillation from the Gaussian head
    kd_alpha: float = 0.4
    #: temperature of that distillation
    kd_temperature: float = 4.0
    #: blend of the Gaussian heads that forms the distillation teacher
    teacher_blend: float = 0.7
    #: how the frozen encoder runs
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ConfigError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.synthetic_covariance not in SYNTHETIC_COVARIANCES:
            raise ConfigError(
                f"synthetic_covariance must be one of {', '.join(SYNTHETIC_COVARIANCES)}, "
                f"got {self.synthetic_covariance!r}"
            )
        unit = (
            "shrinkage",
            "qda_shrinkage",
            "nb_shrinkage",
            "pooling",
            "synthetic_shrinkage",
            "kd_alpha",
            "teacher_blend",
        )
        for name in unit:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.fisher_energy <= 1.0:
            raise ConfigError(f"fisher_energy must be in (0, 1], got {self.fisher_energy}")
        if not self.ridge >= 0.0:
            raise ConfigError(f"ridge must be >= 0, got {self.ridge}")
        if not self.fishermix_margin >= 0.0:
            raise ConfigError(f"fishermix_margin must be >= 0, got {self.fishermix_margin}")
        positive = (
            "fisher_max_dim",
            "synthetic_per_class",
            "synthetic_scale",
            "fishermix_scale",
            "fishermix_batch_size",
            "fishermix_lr",
            "protohyper_rank",
            "protohyper_batch_size",
            "protohyper_lr",
            "kd_temperature",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("fishermix_epochs", "protohyper_epochs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("fishermix_weight_decay", "protohyper_weight_decay"):
            if not getattr(self, name) >= 0.0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    def head_shrinkage(self) -> float:
        """λ of the closed-form head this config builds (lda's for the learned heads)."""
        return {"nb": self.nb_shrinkage, "qda": self.qda_shrinkage}.get(self.head, self.shrinkage)


def learned_setup(
    sums: torch.Tensor, counts: torch.Tensor, second: torch.Tensor, cfg: GHOFLConfig, seed: int
) -> tuple[LearnedSetup, torch.Generator]:
    """The Fisher projection and synthetic features from summed qda statistics,
    and the generator (seeded by ``seed``) that drew them, for the training."""
    mu, sigma, pooled, present = class_gaussians(sums, counts, second)
    n_c = counts.double()[present]
    prior = n_c / n_c.sum()
    mu, sigma = mu[present], sigma[present]
    v = fisher_subspace(
        mu,
        prior,
        pooled,
        shrinkage=cfg.shrinkage,
        energy=cfg.fisher_energy,
        max_dim=cfg.fisher_max_dim,
    )
    mean, cov = synthetic_gaussians(
        mu,
        sigma,
        pooled,
        v,
        covariance=cfg.synthetic_covariance,
        shrinkage=cfg.synthetic_shrinkage,
        scale=cfg.synthetic_scale,
    )
    generator = torch.Generator().manual_seed(seed)
    z, y = synthesize(mean, cov, cfg.synthetic_per_class, generator)
    setup = LearnedSetup(present, v, mu, prior.log(), pooled, z, y)
    return setup, generator


def _fishermix(setup: LearnedSetup, g: torch.Generator, cfg: GHOFLConfig) -> dict[str, Any]:
    return fishermix_head(
        setup,
        scale=cfg.fishermix_scale,
        margin=cfg.fishermix_margin,
        epochs=cfg.fishermix_epochs,
        batch_size=cfg.fishermix_batch_size,
        lr=cfg.fishermix_lr,
        weight_decay=cfg.fishermix_weight_decay,
        generator=g,
    )


def _protohyper(setup: LearnedSetup, g: torch.Generator, cfg: GHOFLConfig) -> dict[str, Any]:
    return protohyper_head(
        setup,
        shrinkage=cfg.shrinkage,
        rank=cfg.protohyper_rank,
        teacher_blend=cfg.teacher_blend,
        kd_alpha=cfg.kd_alpha,
        temperature=cfg.kd_temperature,
        epochs=cfg.protohyper_epochs,
        batch_size=cfg.protohyper_batch_size,
        lr=cfg.protohyper_lr,
        weight_decay=cfg.protohyper_weight_decay,
        generator=g,
    )


#: Learned head → its trainer on the synthetic set.
TRAINERS: dict[str, Callable[[LearnedSetup, torch.Generator, GHOFLConfig], dict[str, Any]]] = {
    "fishermix": _fishermix,
    "protohyper": _protohyper,
}

#: Head → (keys of its parameters in the server state, the module built from them).
MODULES: dict[str, tuple[tuple[str, ...], Callable[..., nn.Module]]] = {
    "lda": (("weight", "bias"), GaussianHead),
    "nb": (("mean", "whiten", "const"), GaussianClassHead),
    "qda": (("mean", "whiten", "const"), GaussianClassHead),
    "fishermix": (("projection", "weight", "bias", "scale"), FisherMixHead),
    "protohyper": (
        ("projection", "mean", "log_prior", "sigma2", "down", "up", "bias"),
        ProtoHyperHead,
    ),
}


@register_method("ghofl")
class GHOFL(FrozenEncoderMethod, Screening, SiteEvaluation, Reporting):
    """Gaussian heads (nb / lda / qda) and learned heads (fishermix /
    protohyper) from per-class feature moments.

    Server state: ``{"encoder", "head", <head's tensors>, "clients": {id: {bytes, num_samples}}}``.
    """

    Config: ClassVar[type] = GHOFLConfig
    trains_with_recipe: ClassVar[bool] = False  # its own fits: fishermix_lr, protohyper_lr
    card: ClassVar[MethodCard] = dataclasses.replace(
        FrozenEncoderMethod.card,
        summary=(
            "Clients of a frozen encoder send per-class feature moments; the server builds "
            "Gaussian or learned heads."
        ),
        paper=(
            'Turazza, Picone & Mamei, "The Gaussian-Head OFL Family: One-Shot Federated Learning '
            'from Client Global Statistics", ICLR 2026'
        ),
        smoke=(
            "data.image_size=16",
            "model.name=vit_tiny_patch2_16",
            "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
        ),
    )

    config: GHOFLConfig

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        encoder = self.check_broadcast(ctx, broadcast)
        features = self.client_tokens(ctx, data, encoder)[:, 0]
        stats = class_moments(features, data.labels, self.run.num_classes, self.config.head)
        counts = [int(n) for n in stats.pop("class_counts")]
        return Upload(tensors=stats, meta={"num_samples": len(data), "class_counts": counts})

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        c, d = self.run.num_classes, self.token_dim()
        key = MOMENT_KEYS[self.config.head]
        moment = {
            "class_squares": TensorSpec((c, d), torch.float64, low=0.0),
            "second_moment": TensorSpec((d, d), torch.float64),
            "class_second_moments": TensorSpec((c, d, d), torch.float64),
        }[key]
        return UploadSpec(
            tensors={"class_sums": TensorSpec((c, d), torch.float64), key: moment},
            meta={
                "num_samples": NUM_SAMPLES,
                "class_counts": MetaSpec("int_list", low=0, length=c, sum_of="num_samples"),
            },
        )

    def screen(self, state: dict[str, Any], round: int, client: int, upload: Upload) -> str | None:
        """Statistics no set of features can produce are refused
        (:func:`moments_problem`): they could only break the server's solve."""
        t, head = upload.tensors, self.config.head
        return moments_problem(
            head, t["class_sums"], upload.meta["class_counts"], t[MOMENT_KEYS[head]]
        )

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        cfg, ids = self.config, sorted(uploads)
        key = MOMENT_KEYS[cfg.head]
        sums = sum(uploads[c].tensors["class_sums"] for c in ids)
        moment = sum(uploads[c].tensors[key] for c in ids)
        counts = torch.tensor(
            [
                sum(uploads[c].meta["class_counts"][k] for c in ids)
                for k in range(self.run.num_classes)
            ]
        )
        if cfg.head in TRAINERS:
            setup, generator = learned_setup(
                sums, counts, moment, cfg, derive_seed(self.run.seed, "ghofl", cfg.head)
            )
            params = TRAINERS[cfg.head](setup, generator, cfg)
        else:
            params = gaussian_head(
                cfg.head,
                sums,
                counts,
                moment,
                shrinkage=cfg.head_shrinkage(),
                ridge=cfg.ridge,
                pooling=cfg.pooling,
            )
        clients = {
            c: {
                "num_samples": uploads[c].meta["num_samples"],
                "bytes": part_bytes(uploads[c], {"statistics": lambda k: True}),
            }
            for c in ids
        }
        return {"encoder": state["encoder"], "head": cfg.head, **params, "clients": clients}

    def predictor(self, state: dict[str, Any]) -> Predictor:
        keys, build = MODULES[state["head"]]
        module = build(*(state[k] for k in keys))
        return TokenPredictor(self.encoder(), self.view_sets(), module)

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        keys, _ = MODULES[state["head"]]
        return {"head": state["head"], **{k: state[k] for k in keys}}

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Encoder identity, bytes up per client (all statistics), no generation."""
        clients = state.get("clients", {})
        cfg = self.config
        out = {
            "encoder": state["encoder"],
            "bytes_up": {str(c): v["bytes"] for c, v in clients.items()},
            "gflops_per_sample": None,
            "head": cfg.head,
            "shrinkage": cfg.head_shrinkage(),
            "ridge": cfg.ridge,
            "pooling": cfg.pooling,
        }
        if "projection" in state:
            out["fisher_dim"] = int(state["projection"].shape[1])
        return out
