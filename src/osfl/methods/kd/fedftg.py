"""FedFTG run in one round as a one-shot baseline (method ``fedftg``).

Zhang et al., "Fine-tuning Global Model via Data-Free Knowledge Distillation
for Non-IID Federated Learning", CVPR 2022 (code: ZhangLin-PKU/FedFTG,
``train_global_model_cgan_bs_weight_iloop_fz_dis`` and ``train_gan_fn.py``).
FedMITR runs it with a single communication round. The server fine-tunes the
clients' FedAvg model with a conditional generator G(z, y) (FedFTG's
``CGeneratorA``: tanh + non-affine BN output):

- *customised label sampling*: the labels of all ``iterations`` batches are
  split in proportion to the global class counts ``n^y = Σ_k n_k^y`` (the
  clients' class counts, uploaded as ``meta.class_counts``), then shuffled;
- *class-level ensemble*: sample b of class y weighs client k by
  ``α_k^y = n_k^y / n^y``;
- *hard sample mining*: per iteration, for each client k in turn, one Adam
  step of G on
  ``-mean_b(α_k^{y_b} · mean_c |s - t_k|) + mean_b(α_k^{y_b} · CE(t_k, y))
  + diversity(z, G(z, y)) / #clients`` (the l1 model discrepancy is the
  adversarial term; the diversity loss is ``exp(-mean(d_z · d_x))`` over
  pairs, l2 on z, l1 on images);
- *distillation*: ``inner_steps`` SGD steps of the server model on the same
  batch towards the class-level ensemble's probabilities
  ``Σ_k α_k^{y} softmax(t_k)`` with the code's loss
  ``mean(-log_softmax(s) ⊙ target)`` (the mean runs over batch *and*
  classes, i.e. soft cross-entropy / K).

Defaults are the code's: 10 iterations, 1 generator step per client and 5
server steps per iteration, batch 50, generator Adam lr 0.01, server SGD lr
0.1 without momentum, weight decay 1e-3, z of 100 (CIFAR-10) dims, server
model = the clients' FedAvg, server BN in train mode while distilling.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import MethodCard, register_method
from osfl.fl.optim import build_optimizer
from osfl.fl.upload import Broadcast, MetaSpec, Upload, UploadSpec
from osfl.methods.kd.base import (
    WEAK_FEDAVG_TASK,
    DistillationMethod,
    KDConfig,
    ServerSide,
    epoch_log,
    frozen,
)
from osfl.methods.kd.dense import build_generator
from osfl.methods.kd.distill import DistillConfig
from osfl.methods.kd.generator import GeneratorConfig
from osfl.methods.kd.priors import l1_discrepancy
from osfl.methods.kd.teacher import EnsembleTeacher

log = logging.getLogger(__name__)


def _default_distill() -> DistillConfig:
    # the code's server optimiser: SGD lr 0.1, no momentum, weight decay 1e-3
    return DistillConfig(optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=1e-3)


def _default_generator() -> GeneratorConfig:
    # CGeneratorA with z of 100 dims, one Adam step (lr 0.01) per client per iteration
    return GeneratorConfig(nz=100, ngf=64, steps=1, lr=0.01, augment="none")


#: DistillConfig fields FedFTG does not use (its loss is the code's soft CE on
#: the synthesis batch, ``inner_steps`` times): a changed value is refused.
_UNUSED_DISTILL = ("batch_size", "steps", "temperature", "kd_weight", "ce_weight")


@dataclass(frozen=True)
class FedFTGConfig(KDConfig):
    """FedFTG's defaults (its code); ``epochs`` = the code's ``iterations``.
    ``distill``: only its optimizer fields (and ``grad_clip``) apply;
    ``generator``: ``nz``, ``ngf``, ``steps`` (per client per iteration), ``lr``."""

    init: str = "fedavg"
    epochs: int = 10
    synthesis_batch_size: int = 50
    distill: DistillConfig = field(default_factory=_default_distill)
    #: the conditional generator and its training
    generator: GeneratorConfig = field(default_factory=_default_generator)
    #: server distillation steps per generated batch
    inner_steps: int = 5
    #: weight of the generator's class-weighted cross-entropy
    cls_weight: float = 1.0
    #: weight of the generator's diversity term (``dis``: diversity)
    dis_weight: float = 1.0
    #: weight of the generator's model-discrepancy (adversarial) term (``md``)
    md_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"method.fedftg: {msg}")

        need(self.inner_steps >= 1, f"inner_steps must be >= 1, got {self.inner_steps}")
        for name, value in (
            ("cls_weight", self.cls_weight),
            ("dis_weight", self.dis_weight),
            ("md_weight", self.md_weight),
        ):
            need(value >= 0, f"{name} must be >= 0, got {value}")
        base = _default_distill()
        for name in _UNUSED_DISTILL:
            need(
                getattr(self.distill, name) == getattr(base, name),
                f"distill.{name} does not apply to FedFTG (its server loss is the code's "
                "soft cross-entropy on each synthesis batch, inner_steps times)",
            )
        need(
            self.generator.augment == "none" and self.generator.grad_clip is None,
            "generator.augment and generator.grad_clip do not apply to FedFTG's "
            "conditional generator; leave them at none / null",
        )


def customised_labels(
    total: int, class_counts: np.ndarray, generator: torch.Generator
) -> torch.Tensor:
    """``total`` labels split in proportion to ``class_counts`` (the code's
    ``generate_labels``: cumulative proportions, floored), then shuffled."""
    counts = np.asarray(class_counts, dtype=np.float64)
    if counts.sum() <= 0:
        raise ConfigError("customised label sampling needs a positive class count")
    cuts = (np.cumsum(counts / counts.sum()) * total).astype(int)[:-1]
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(np.diff(np.r_[0, cuts, total]))])
    perm = torch.randperm(total, generator=generator)
    return torch.as_tensor(labels, dtype=torch.long)[perm]


def client_class_weights(counts: np.ndarray) -> np.ndarray:
    """(M, K) counts -> α_k^y = n_k^y / Σ_k n_k^y (a column of zeros for an absent class)."""
    counts = np.asarray(counts, dtype=np.float64)
    tot = counts.sum(0, keepdims=True)
    return np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)


def diversity_loss(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """FedFTG's ``DiversityLoss(metric='l1')``: ``exp(-mean(d_z ⊙ d_x))`` with
    pairwise mean squared distances of the noises and mean absolute distances
    of the images; small when distinct noises give distinct images."""
    z = z.flatten(1)
    x = x.flatten(1)
    dz = (z[None, :, :] - z[:, None, :]).pow(2).mean(-1)
    dx = (x[None, :, :] - x[:, None, :]).abs().mean(-1)
    return torch.exp(-(dz * dx).mean())


@register_method("fedftg")
class FedFTG(DistillationMethod):
    """Conditional-generator fine-tuning of the FedAvg model (one round)."""

    Config: ClassVar[type] = FedFTGConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "Fine-tunes the clients' FedAvg model by distillation on images of a conditional "
            "generator, in one round."
        ),
        paper=(
            'Zhang et al., "Fine-tuning Global Model via Data-Free Knowledge Distillation for '
            'Non-IID Federated Learning", CVPR 2022'
        ),
        smoke=(
            *WEAK_FEDAVG_TASK,
            "method.fedftg.epochs=3",
        ),
    )

    # --- client side: the shared client + its class counts --------------------------
    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        upload = super().client_update(ctx, broadcast, data)
        counts = np.bincount(data.labels.numpy(), minlength=self.run.num_classes)
        upload.meta["class_counts"] = [int(c) for c in counts[: self.run.num_classes]]
        return upload

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        """The model upload plus ``class_counts``: one non-negative count per
        class, summing to ``num_samples``."""
        spec = super().upload_spec(state, round, client)
        counts = MetaSpec("int_list", low=0, length=self.run.num_classes, sum_of="num_samples")
        return replace(spec, meta={**spec.meta, "class_counts": counts})

    # --- server side ----------------------------------------------------------------
    def build_teacher(self, side: ServerSide, models: list[nn.Module]) -> EnsembleTeacher:
        counts = np.array([side.meta[c]["class_counts"] for c in side.client_ids])
        return EnsembleTeacher(
            models, None, class_weights=client_class_weights(counts), combine="probs"
        )

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg: FedFTGConfig = self.config
        gen = build_generator(side, cfg.generator, num_classes=side.num_classes, output="tanh_bn")
        gen.train()
        members = list(teacher.members)
        counts = np.array([side.meta[c]["class_counts"] for c in side.client_ids])
        alpha = torch.as_tensor(
            client_class_weights(counts), dtype=torch.float32, device=side.device
        )
        bs = cfg.synthesis_batch_size
        labels_all = customised_labels(cfg.epochs * bs, counts.sum(0), side.generator)
        opt_g = torch.optim.Adam(gen.parameters(), lr=cfg.generator.lr)
        opt_s = build_optimizer(list(student.parameters()), cfg.distill)
        k = side.num_classes
        with self.run.progress.task(f"{self.name}: server", cfg.epochs) as bar:
            for it in range(cfg.epochs):
                y = labels_all[it * bs : (it + 1) * bs].to(side.device)
                w = alpha[:, y]  # (M, B): α_k^{y_b}
                nz = cfg.generator.nz
                z = torch.randn((y.shape[0], nz), generator=side.generator).to(side.device)
                with side.timer.phase("synthesis"), frozen(student):
                    student.eval()
                    gen.train()
                    for _ in range(cfg.generator.steps):
                        for m, member in enumerate(members):
                            opt_g.zero_grad(set_to_none=True)
                            x = gen(z, y)
                            t = member(x)
                            loss = (
                                -cfg.md_weight * l1_discrepancy(student(x), t, w[m])
                                + cfg.cls_weight
                                * (F.cross_entropy(t, y, reduction="none") * w[m]).mean()
                                + cfg.dis_weight * diversity_loss(z, x) / len(members)
                            )
                            loss.backward()
                            opt_g.step()
                with side.timer.phase("distillation"):
                    gen.eval()
                    with torch.no_grad():
                        x = gen(z, y)
                        target = teacher.combine(teacher.member_logits(x), y).exp()
                    student.train()
                    for _ in range(cfg.inner_steps):
                        opt_s.zero_grad(set_to_none=True)
                        loss_s = torch.mean(-F.log_softmax(student(x), dim=-1) * target)
                        loss_s.backward()
                        if cfg.distill.grad_clip is not None:
                            clip = cfg.distill.grad_clip
                            torch.nn.utils.clip_grad_norm_(student.parameters(), clip)
                        opt_s.step()
                    student.eval()
                epoch_log(
                    self.name,
                    it,
                    cfg.epochs,
                    g_loss=float(loss.detach()),
                    s_loss=float(loss_s.detach()) * k,
                )
                loss_info = f"loss {float(loss_s.detach()):.3f}"
                bar.advance(description=f"{self.name}: server ({loss_info})")
        return student
