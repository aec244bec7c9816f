"""DeepInversion and ADI as one-shot FL baselines (methods ``deepinversion``, ``adi``).

Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via
DeepInversion", CVPR 2020: synthesise images by optimising pixels
(:func:`osfl.methods.kd.pixels.invert`: CE + BN statistics + TV + l2, Adam,
jitter/flip); Adaptive DeepInversion (ADI) adds the Jensen-Shannon
competition with the student. In one-shot FL (FedMITR's DeepInversion column,
"adaptive deep inversion is employed", Appendix A) the server alternates, for
``epochs`` rounds (FedMITR's Algorithm 1 without the sparse mask and the token
relabel):

1. invert one batch of ``synthesis_batch_size`` random labels per client
   model in turn (``target="clients"``, FedMITR's "about each local model")
   or of the whole ensemble (``target="ensemble"``, BN statistics of every
   client's BN layers averaged over the clients);
2. add them to the synthetic pool;
3. distil the ensemble into the server model over the pool (KD-KL at
   ``temperature``, optionally CE to the inversion labels).

For ViT clients (no BatchNorm) the BN term vanishes and this is the dense
model inversion that FedMITR's sparse inversion improves on.

Defaults: FedMITR Appendix A (inversion: 100 iterations, Adam lr 1e-3, betas
(0.5, 0.99), alpha_TV 1e-4, JS alpha 1.0 for ADI, batch 64; server: SGD lr
1e-3, momentum 0.9, wd 1e-4, batch 64; server model from the clients' FedAvg);
BN weight 10 and jitter 2 from DeepInversion's CIFAR-10 script. See
docs/methods/kd.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.methods.kd.base import WEAK_FEDAVG_TASK, DistillationMethod, KDConfig, ServerSide
from osfl.methods.kd.pixels import (
    ForwardFn,
    InversionConfig,
    InversionState,
    invert,
    random_labels,
)
from osfl.methods.kd.pool import SyntheticPool
from osfl.methods.kd.priors import BNStatsLoss
from osfl.methods.kd.teacher import EnsembleTeacher

TARGETS = ("clients", "ensemble")


@dataclass(frozen=True)
class DeepInversionConfig(KDConfig):
    """KDConfig (server recipe) + the pixel-inversion recipe ``inversion``
    (:class:`~osfl.methods.kd.pixels.InversionConfig`; BN-statistics weight 10
    as in Yin et al.'s CIFAR setting) + ``target`` (invert each client, or
    their ensemble)."""

    #: what is inverted: clients (each client's model in turn) or ensemble (their mean)
    target: str = "clients"
    #: the pixel-inversion recipe
    inversion: InversionConfig = field(default_factory=lambda: InversionConfig(bn_weight=10.0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target not in TARGETS:
            raise ConfigError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")


@dataclass(frozen=True)
class ADIConfig(DeepInversionConfig):
    """DeepInversion + the JS competition with the student (FedMITR's alpha = 1.0)."""

    inversion: InversionConfig = field(
        default_factory=lambda: InversionConfig(bn_weight=10.0, js_weight=1.0)
    )


def _module_forward(model: nn.Module) -> ForwardFn:
    def fwd(x: torch.Tensor, state: InversionState) -> torch.Tensor:
        return model(x)

    return fwd


def _inversion_smoke(name: str) -> tuple[str, ...]:
    """The smoke overrides of DeepInversion and ADI (same task, same budget)."""
    return (
        *WEAK_FEDAVG_TASK,
        f"method.{name}.epochs=2",
        f"method.{name}.synthesis_batch_size=16",
        f"method.{name}.inversion={{iterations: 10, lr: 0.05, bn_weight: 0.1}}",
        f"method.{name}.distill={{steps: 15, lr: 0.01}}",
    )


@register_method("deepinversion")
class DeepInversion(DistillationMethod):
    """Pixel inversion of the clients + KD of their ensemble (see module docstring)."""

    Config: ClassVar[type] = DeepInversionConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "The server synthesises images by inverting the client models, then distils their "
            "ensemble into one model."
        ),
        paper=(
            'Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via DeepInversion", '
            "CVPR 2020"
        ),
        smoke=_inversion_smoke("deepinversion"),
    )

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg = self.config
        inv = cfg.inversion
        members = list(teacher.members)
        if cfg.target == "clients":
            targets = [(_module_forward(m), BNStatsLoss([m])) for m in members]
        else:
            # mean over clients of the summed per-layer BN losses
            inv = dataclasses.replace(inv, bn_weight=inv.bn_weight / len(members))
            targets = [(_module_forward(teacher), BNStatsLoss(members))]
        pool = SyntheticPool(cfg.pool_size, side.device)
        distiller = self.pool_distiller(side, teacher, student)
        student_fwd = _module_forward(student) if inv.js_weight > 0 else None

        def synthesize(epoch: int) -> dict[str, float]:
            for fwd, bn in targets:
                labels = random_labels(cfg.synthesis_batch_size, side.num_classes, side.generator)
                res = invert(
                    fwd,
                    labels,
                    side.image_shape,
                    inv,
                    space=side.space,
                    bn=bn,
                    student=student_fwd,
                    generator=side.generator,
                    device=side.device,
                )
                pool.add(res.images, res.labels)
            return {f"inv_{k}": v for k, v in res.losses.items()}

        try:
            self.synthesis_distillation_epochs(side, student, distiller, pool, synthesize)
        finally:
            for _, bn in targets:
                bn.remove()
        return student


@register_method("adi")
class ADI(DeepInversion):
    """Adaptive DeepInversion: DeepInversion with the student competition term."""

    Config: ClassVar[type] = ADIConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DeepInversion.card,
        summary=(
            "DeepInversion whose images also seek where the server model disagrees with the "
            "clients (Adaptive DI)."
        ),
        paper=(
            'Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via DeepInversion", '
            "CVPR 2020 (Adaptive DeepInversion)"
        ),
        smoke=_inversion_smoke("adi"),
    )
