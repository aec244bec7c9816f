"""Co-Boosting: data and ensemble co-boosting for one-shot FL (method ``coboosting``).

Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble
Co-Boosting", ICLR 2024 (code: rong-dai/Co-Boosting, ``COBOOSTSynthesizer``
and ``cb_kd_train``). Each server epoch:

1. *hard-sample synthesis*: re-initialised DENSE generator, ``generator.steps`` Adam
   steps on (G, z) minimising

       oh_weight · mean((1 - p_y)^hs · CE(E_w(x), y))        (hard-sample-weighted CE)
     + adv_weight · (-mean KL(E_w(x) || s(x); T=3) · T²)      (adversarial, unmasked)
     + bn_weight · Σ_BN / #clients                            (off by default)

   with E_w the ensemble with the current learnable weights w; generator
   gradients clipped at norm 10 (``generator.grad_clip``); the lowest-loss batch is kept;
2. *ensemble boosting* (from the second epoch on): for ``wa_steps`` passes
   over the pool, one signed-gradient step per batch on the client weights,
   ``w <- clip(w - mu · wdc^epoch · sign(∇_w CE(E_w(x), y)), 0, 1)``;
3. the new batch joins the pool;
4. *perturbed-input KD*: for each pool batch, an ODS-style perturbation
   ``x' = x + eps · sign(∇_x Σ r ⊙ softmax(E_w(x)/4))`` with r ~ U(-1, 1),
   then ``T² · KL(E_w(x') || s(x'))`` at T = 4, gradients clipped at 10.

Defaults are the code's (``co_boosting.sh`` and the parser): 200 epochs,
generator steps 30 at lr 1e-3, batch 128, KD SGD lr 0.01, momentum 0.9, wd 1e-4,
cosine over epochs, T = 4, hs = 1, mu = 0.01, wdc = 0.99, wa_steps = 1,
eps = 8/255 (applied, as there, to normalised images), oh = adv = 1, bn = 0,
server model from scratch, uniform initial weights.
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
from osfl.methods.kd.base import DistillationMethod, KDConfig, ServerSide
from osfl.methods.kd.dense import build_generator, synthesize_batch
from osfl.methods.kd.distill import DistillConfig, Distiller
from osfl.methods.kd.generator import GeneratorConfig
from osfl.methods.kd.pool import PoolBatch, SyntheticPool
from osfl.methods.kd.priors import BNStatsLoss, adversarial_kl, kd_kl
from osfl.methods.kd.teacher import EnsembleTeacher


@dataclass(frozen=True)
class CoBoostingConfig(KDConfig):
    """Co-Boosting's defaults (its code); see the module docstring. ``distill``
    is the KD of the student (its ``temperature`` is the KD temperature, 4);
    ``generator`` the DENSE generator with Co-Boosting's clip and no
    synthesis-time augmentation."""

    init: str = "scratch"
    epochs: int = 200
    synthesis_batch_size: int = 128
    augment: str = "crop_flip"
    distill: DistillConfig = field(
        default_factory=lambda: DistillConfig(
            batch_size=128, lr=0.01, schedule="cosine", grad_clip=10.0, temperature=4.0
        )
    )
    #: the generator and its training per round
    generator: GeneratorConfig = field(
        default_factory=lambda: GeneratorConfig(augment="none", grad_clip=10.0)
    )
    #: weight of the generator's hard-sample cross-entropy
    oh_weight: float = 1.0
    #: weight of the generator's adversarial term
    adv_weight: float = 1.0
    #: temperature of the adversarial term
    adv_temperature: float = 3.0
    #: weight of the BatchNorm-statistics term (0: off, as the code)
    bn_weight: float = 0.0
    #: exponent hs that up-weights samples the ensemble finds hard
    hard_sample_power: float = 1.0
    #: learn the weights of the client ensemble (false: fixed uniform)
    weighted: bool = True
    #: step size of the ensemble-weight update
    mu: float = 0.01
    #: decay of that step size per round
    wdc: float = 0.99
    #: passes over the pool per ensemble-weight update
    wa_steps: int = 1
    #: size of the output-diversified perturbation of pool images
    ods_eps: float = 8 / 255
    #: temperature of that perturbation
    ods_temperature: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"method.coboosting: {msg}")

        for name, value in (
            ("oh_weight", self.oh_weight),
            ("adv_weight", self.adv_weight),
            ("bn_weight", self.bn_weight),
            ("hard_sample_power", self.hard_sample_power),
            ("mu", self.mu),
            ("ods_eps", self.ods_eps),
        ):
            need(value >= 0, f"{name} must be >= 0, got {value}")
        need(0 < self.wdc <= 1, f"wdc must lie in (0, 1], got {self.wdc}")
        need(self.wa_steps >= 0, f"wa_steps must be >= 0, got {self.wa_steps}")
        need(self.adv_temperature > 0 and self.ods_temperature > 0, "temperatures must be > 0")


def hard_sample_ce(logits: torch.Tensor, labels: torch.Tensor, power: float) -> torch.Tensor:
    """``mean((1 - p_y)^power · CE)``, the weight detached (Co-Boosting's ``loss_oh``):
    confidently classified samples count less, hard ones more. ``power=0`` is CE."""
    ce = F.cross_entropy(logits, labels, reduction="none")
    if power == 0:
        return ce.mean()
    p = F.softmax(logits, dim=-1).gather(1, labels[:, None]).squeeze(1).detach()
    return ((1 - p).pow(power) * ce).mean()


def boost_ensemble_weights(
    teacher: EnsembleTeacher,
    pool: SyntheticPool,
    step_size: float,
    *,
    passes: int = 1,
    batch_size: int = 128,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Co-Boosting's ensemble update: signed-gradient descent of the weighted
    ensemble's CE on the labelled pool, one step per batch, weights clipped to
    [0, 1] (the code's ``eta = clamp(w - w0, -1, 1)`` is implied by that box).
    Returns the new weights (also set on ``teacher``)."""
    w = teacher.weights.detach().clone()
    device = w.device
    for _ in range(passes):
        for batch in pool.batches(batch_size, generator=generator):
            if not batch.has_labels:
                continue
            x, y = batch.images.to(device), batch.labels.to(device)
            with torch.no_grad():
                member = teacher.member_logits(x)
            w = w.detach().requires_grad_(True)
            loss = F.cross_entropy(teacher.combine(member, weights=w), y)
            (grad,) = torch.autograd.grad(loss, w)
            w = (w - step_size * grad.sign()).clamp(0.0, 1.0).detach()
    if float(w.sum()) <= 0:  # every weight pushed to zero: keep the old ones
        return teacher.weights.detach().clone()
    teacher.set_weights(w)
    return w


def ods_perturb(
    teacher: nn.Module, x: torch.Tensor, eps: float, temperature: float, rng: torch.Generator | None
) -> torch.Tensor:
    """Output-diversified perturbation (Tashiro et al., NeurIPS 2020, as used by
    Co-Boosting's KD): one signed step of size ``eps`` along the gradient of a
    random projection ``r ⊙ softmax(E(x)/T)``, r ~ U(-1, 1)."""
    if eps == 0:
        return x
    x = x.detach().requires_grad_(True)
    out = F.softmax(teacher(x) / temperature, dim=-1)
    r = (torch.rand(out.shape, generator=rng) * 2 - 1).to(out.device)
    # backward() rather than autograd.grad: the latter refuses leaf inputs while a
    # FlopCounterMode (count_flops) tracks modules; the teacher's parameters are frozen
    (r * out).sum().backward()
    assert x.grad is not None  # x requires grad and reaches the output
    return (x + eps * x.grad.sign()).detach()


@register_method("coboosting")
class CoBoosting(DistillationMethod):
    """Hard samples + learnable ensemble weights + perturbed-input KD."""

    Config: ClassVar[type] = CoBoostingConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "DENSE-style synthesis of hard samples plus a learned weighting of the client models, "
            "then distillation."
        ),
        paper=(
            'Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble '
            'Co-Boosting", ICLR 2024'
        ),
        smoke=(
            "method.coboosting.epochs=3",
            "method.coboosting.synthesis_batch_size=32",
            "method.coboosting.generator.steps=5",
            "method.coboosting.distill={batch_size: 32, steps: 30, lr: 0.05, schedule: constant}",
        ),
    )

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg: CoBoostingConfig = self.config
        gen = build_generator(side, cfg.generator)
        members = list(teacher.members)
        bn = BNStatsLoss(members) if cfg.bn_weight > 0 else None
        pool = SyntheticPool(cfg.pool_size, side.device)

        def kd_loss(d: Distiller, batch: PoolBatch, x: torch.Tensor) -> torch.Tensor:
            xp = ods_perturb(teacher, x, cfg.ods_eps, cfg.ods_temperature, side.generator)
            with torch.no_grad():
                t = teacher(xp)
            return kd_kl(d.student(xp), t, cfg.distill.temperature)

        distiller = self.pool_distiller(side, teacher, student, loss_fn=kd_loss)

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            if bn is not None:
                with bn.capture():
                    t = teacher(x)
            else:
                t = teacher(x)
            terms = {"oh": cfg.oh_weight * hard_sample_ce(t, y, cfg.hard_sample_power)}
            if bn is not None:
                terms["bn"] = cfg.bn_weight * bn.value("sum").to(x.device) / len(members)
            if cfg.adv_weight > 0:
                terms["adv"] = cfg.adv_weight * adversarial_kl(
                    student(x), t, cfg.adv_temperature, masked=False
                )
            loss = sum(terms.values())
            return loss, {k: float(v.detach()) for k, v in terms.items()}  # type: ignore[union-attr]

        def synthesize_epoch(epoch: int) -> dict[str, float]:
            x, y, terms = synthesize_batch(
                side, cfg.generator, cfg.synthesis_batch_size, gen, loss_fn
            )
            # the student stays frozen here too: the weight update reads only the teacher
            if cfg.weighted and epoch > 0 and cfg.wa_steps > 0:
                boost_ensemble_weights(
                    teacher,
                    pool,
                    cfg.mu * cfg.wdc**epoch,
                    passes=cfg.wa_steps,
                    batch_size=cfg.distill.batch_size,
                    generator=side.generator,
                )
            pool.add(x, y)
            return terms

        def log_values(kd: float, terms: dict[str, float]) -> dict[str, float]:
            return {
                "kd_loss": kd,
                **terms,
                "w_min": float(teacher.weights.min()),
                "w_max": float(teacher.weights.max()),
            }

        try:
            self.synthesis_distillation_epochs(
                side, student, distiller, pool, synthesize_epoch, log_values
            )
        finally:
            if bn is not None:
                bn.remove()
        return student
