"""DENSE: data-free one-shot FL by generator synthesis + ensemble distillation
(method ``dense``).

Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022
(code: zj-jayzhang/DENSE, ``AdvSynthesizer`` and ``kd_train`` in
``loop_df_fl.py``). For each of ``epochs`` server rounds:

1. *data generation*: re-initialise the generator (:class:`Generator`,
   z=256 -> 128×8×8 -> ... -> sigmoid), draw z and random labels y, and
   take ``generator.steps`` Adam steps on (generator, z) minimising on a randomly
   cropped/flipped view of G(z)

       bn_weight · Σ_{all clients' BN layers} ||μ - μ̂|| + ||σ² - σ̂²||   (similarity)
     + oh_weight · CE(E(x), y)                                           (stability)
     + adv_weight · (-mean(1[argmax s ≠ argmax E] · KL(E(x) || s(x))))   (transferability)

   with E the uniform average of the client logits; keep the lowest-loss batch;
2. *model distillation*: one pass over the whole pool of generated images
   (crop + flip) with ``T² · KL`` at temperature ``T``.

Defaults are the DENSE README's CIFAR-10 command (200 epochs, generator steps
30 at lr 1e-3, bn = oh = adv = 1, T = 20, batch 256 for both synthesis and KD,
SGD lr 0.005 momentum 0.9) and the code's choices (server model re-created
from scratch, uniform ensemble, generator reset each round, history pool).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.methods.kd.augment import build_augment
from osfl.methods.kd.base import (
    DistillationMethod,
    KDConfig,
    ServerSide,
    seeded,
)
from osfl.methods.kd.distill import DistillConfig
from osfl.methods.kd.generator import Generator, GeneratorConfig, GeneratorLoss, synthesize
from osfl.methods.kd.pixels import random_labels
from osfl.methods.kd.pool import SyntheticPool
from osfl.methods.kd.priors import BNStatsLoss, adversarial_kl
from osfl.methods.kd.teacher import EnsembleTeacher


@dataclass(frozen=True)
class DENSEConfig(KDConfig):
    """DENSE's defaults (README CIFAR-10 command); see the module docstring.
    ``generator``: the generator and its per-round training
    (:class:`~osfl.methods.kd.generator.GeneratorConfig`)."""

    init: str = "scratch"
    epochs: int = 200
    synthesis_batch_size: int = 256
    augment: str = "crop_flip"
    distill: DistillConfig = field(
        default_factory=lambda: DistillConfig(
            batch_size=256, lr=0.005, weight_decay=0.0, temperature=20.0
        )
    )
    #: the generator and its training per round
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    #: weight of the generator's BatchNorm-statistics term
    bn_weight: float = 1.0
    #: weight of the generator's cross-entropy term
    oh_weight: float = 1.0
    #: weight of the generator's adversarial term
    adv_weight: float = 1.0
    #: temperature of the adversarial term
    adv_temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in (
            ("bn_weight", self.bn_weight),
            ("oh_weight", self.oh_weight),
            ("adv_weight", self.adv_weight),
        ):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if not self.adv_temperature > 0:
            raise ConfigError(f"adv_temperature must be > 0, got {self.adv_temperature}")


def build_generator(side: ServerSide, cfg: GeneratorConfig, **kwargs: object) -> Generator:
    c, h, _ = side.image_shape
    with seeded(side.seed("generator")):
        return Generator(cfg.nz, cfg.ngf, h, c, **kwargs).to(side.device)  # type: ignore[arg-type]


def synthesize_batch(
    side: ServerSide,
    cfg: GeneratorConfig,
    batch_size: int,
    gen: Generator,
    loss_fn: GeneratorLoss,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """One synthesis round of DENSE / Co-Boosting on ``batch_size`` random
    labels (the generator recipe ``cfg``: steps, lr, the augmentation of the
    views the loss sees, gradient clip): the images, their labels and the kept
    batch's loss terms. The caller adds them to its pool."""
    y = random_labels(batch_size, side.num_classes, side.generator)
    x, terms = synthesize(
        gen,
        y,
        loss_fn,
        iterations=cfg.steps,
        lr=cfg.lr,
        space=side.space,
        augment=build_augment(cfg.augment, side.image_shape[-1]),
        rng=side.generator,
        grad_clip=cfg.grad_clip,
        device=side.device,
    )
    return x, y, terms


@register_method("dense")
class DENSE(DistillationMethod):
    """Generator synthesis (BN + CE + masked adversarial KL) + KD over the pool."""

    Config: ClassVar[type] = DENSEConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "The server trains a generator against the client ensemble and distils the ensemble "
            "into one model on its images."
        ),
        paper='Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022',
        smoke=(
            "method.dense.epochs=3",
            "method.dense.synthesis_batch_size=32",
            "method.dense.generator.steps=5",
            "method.dense.distill={batch_size: 32, steps: 30, lr: 0.05, temperature: 4.0}",
        ),
    )

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg: DENSEConfig = self.config
        gen = build_generator(side, cfg.generator)
        bn = BNStatsLoss(list(teacher.members))
        pool = SyntheticPool(cfg.pool_size, side.device)
        distiller = self.pool_distiller(side, teacher, student)

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            with bn.capture():
                t = teacher(x)
            terms = {
                "bn": cfg.bn_weight * bn.value("sum").to(x.device),
                "oh": cfg.oh_weight * F.cross_entropy(t, y),
            }
            if cfg.adv_weight > 0:
                s = student(x)
                terms["adv"] = cfg.adv_weight * adversarial_kl(
                    s, t, cfg.adv_temperature, masked=True
                )
            loss = sum(terms.values())
            return loss, {k: float(v.detach()) for k, v in terms.items()}  # type: ignore[union-attr]

        def synthesize_epoch(epoch: int) -> dict[str, float]:
            x, y, terms = synthesize_batch(
                side, cfg.generator, cfg.synthesis_batch_size, gen, loss_fn
            )
            pool.add(x, y)
            return terms

        try:
            self.synthesis_distillation_epochs(side, student, distiller, pool, synthesize_epoch)
        finally:
            bn.remove()
        return student
