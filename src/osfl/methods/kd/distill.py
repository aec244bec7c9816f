"""Knowledge distillation of a server model on synthetic data.

The student minimises, per batch drawn from the synthetic pool,

    kd_weight · T² · KL(softmax(t/T) || softmax(s/T))  +  ce_weight · CE(s, y)

where ``t`` is the teacher (the client ensemble) on the *same augmented*
batch and ``y`` the pool's pseudo-labels (the labels the samples were
synthesised for). ``kd_weight=1, ce_weight=0`` is the KD of DENSE, Co-Boosting
and DeepInversion's data-free KD (Hinton et al., 2015); FedMITR's "inversion +
PL" ablation is ``kd_weight=0, ce_weight=1``; FedMITR's own Eq. 8 plugs in
through ``loss_fn``.

The optimizer and its learning-rate schedule come from the registries of
local training (:mod:`osfl.fl.optim`), so a config names them exactly as for
clients (``sgdm``, ``adam``, ``cosine``, ...). The schedule advances once per
*epoch* (one synthesis + distillation round), as Co-Boosting's
``CosineAnnealingLR(T_max=epochs)`` does, because the number of steps per
epoch grows with the pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig, build_optimizer, build_schedule
from osfl.methods.kd.pool import PoolBatch, SyntheticPool
from osfl.methods.kd.priors import kd_kl
from osfl.methods.kd.teacher import EnsembleTeacher

__all__ = ["DistillConfig", "DistillStats", "Distiller", "LossFn", "kd_objective"]

#: ``loss_fn(distiller, batch, x_augmented) -> loss``: replaces the KD objective.
LossFn = Callable[["Distiller", PoolBatch, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DistillConfig(OptimConfig):
    """The server's distillation recipe: an optimizer and its schedule (the
    fields of :class:`~osfl.fl.optim.OptimConfig`, shared with local training)
    and the distillation loss. The defaults are FedMITR's Appendix A server
    recipe (SGD lr 1e-3, momentum 0.9, weight decay 1e-4, batch 64, KD at
    T = 1); each method's config starts from its own paper's.

    ``steps`` per :meth:`Distiller.fit_pool` call (``None``: one pass over the
    whole pool, as DENSE, Co-Boosting and FedMITR's Algorithm 1 do).
    ``teacher_on_the_fly=False`` reads the teacher's logits from the pool's
    ``logits`` extra instead of recomputing them (cheaper; only exact without
    augmentation and with fixed ensemble weights).
    """

    optimizer: str = "sgdm"
    lr: float = 1e-3
    weight_decay: float = 1e-4
    #: images per distillation step
    batch_size: int = 64
    #: distillation steps per round (null: one pass over the pool)
    steps: int | None = None
    #: distillation temperature T
    temperature: float = 1.0
    #: weight of the KL term to the teacher
    kd_weight: float = 1.0
    #: weight of the cross-entropy to the synthetic labels
    ce_weight: float = 0.0
    #: recompute the teacher's outputs each step (false: reuse the stored ones; cheaper)
    teacher_on_the_fly: bool = True

    def __post_init__(self) -> None:
        try:  # the optimizer fields: OptimConfig's checks serve both
            super().__post_init__()
        except ConfigError as e:
            raise ConfigError(f"distill: {e}") from None
        if self.batch_size < 1:
            raise ConfigError(f"distill: batch_size must be >= 1, got {self.batch_size}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"distill: steps must be >= 1 or null, got {self.steps}")
        if self.temperature <= 0:
            raise ConfigError(f"distill: temperature must be > 0, got {self.temperature}")
        if self.kd_weight < 0 or self.ce_weight < 0:
            raise ConfigError("distill: kd_weight and ce_weight must be >= 0")


@dataclass(frozen=True)
class DistillStats:
    steps: int
    samples: int
    mean_loss: float
    seconds: float


def kd_objective(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor | None,
    labels: torch.Tensor | None,
    cfg: DistillConfig,
) -> torch.Tensor:
    """``kd_weight · KD-KL(s, t; T) + ce_weight · CE(s, y)`` (terms with weight 0 skipped).

    Samples without a label (``-1``) are left out of the CE term.
    """
    loss = student_logits.new_zeros(())
    if cfg.kd_weight > 0:
        if teacher_logits is None:
            raise ConfigError("kd_weight > 0 needs teacher logits")
        loss = loss + cfg.kd_weight * kd_kl(student_logits, teacher_logits, cfg.temperature)
    if cfg.ce_weight > 0 and labels is not None:
        has = labels >= 0
        if bool(has.any()):
            loss = loss + cfg.ce_weight * F.cross_entropy(student_logits[has], labels[has])
    return loss


class Distiller:
    """Holds the student, its optimizer and schedule across epochs.

    The learning-rate schedule spans ``epochs`` :meth:`end_epoch` calls (one
    per server epoch). ``augment(x, generator)`` (an osfl batched transform on float batches,
    e.g. pad-crop + flip) is applied to each pool batch before both the
    student and the teacher see it.
    """

    def __init__(
        self,
        student: nn.Module,
        teacher: nn.Module | None,
        cfg: DistillConfig,
        *,
        epochs: int = 1,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None = None,
        loss_fn: LossFn | None = None,
    ):
        self.student = student.to(device)
        self.teacher = teacher.to(device) if teacher is not None else None
        self.cfg = cfg
        self.device = torch.device(device)
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.augment = augment
        self.loss_fn = loss_fn
        self.params = [p for p in self.student.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, cfg)
        self.schedule = build_schedule(self.optimizer, cfg, epochs)
        self.steps_done = 0
        self.epochs_done = 0

    @torch.no_grad()
    def teacher_logits(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.teacher is None:
            raise ConfigError("this distiller has no teacher")
        self.teacher.eval()
        if isinstance(self.teacher, EnsembleTeacher):  # labels select class-level weights
            return self.teacher(x, labels)
        return self.teacher(x)

    def objective(self, batch: PoolBatch, x: torch.Tensor) -> torch.Tensor:
        """The default objective on one (augmented) batch."""
        t = None
        if self.cfg.kd_weight > 0:
            stored = batch.extras.get("logits")
            if not self.cfg.teacher_on_the_fly and stored is not None:
                t = stored.to(self.device)
            else:
                t = self.teacher_logits(x, batch.labels if batch.has_labels else None)
        return kd_objective(self.student(x), t, batch.labels, self.cfg)

    def step(self, batch: PoolBatch) -> torch.Tensor:
        """One optimizer step on ``batch``; returns the (detached) loss."""
        self.student.train()
        x = batch.images.to(self.device)
        batch = PoolBatch(x, batch.labels.to(self.device), batch.extras)
        if self.augment is not None:
            x = self.augment(x, self.generator)
        loss = (
            self.loss_fn(self, batch, x) if self.loss_fn is not None else self.objective(batch, x)
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.steps_done += 1
        return loss.detach()

    def end_epoch(self) -> None:
        """Advance the learning-rate schedule by one unit (``epochs`` units in all)."""
        self.schedule.step()
        self.epochs_done += 1

    def fit_pool(self, pool: SyntheticPool, steps: int | None = None) -> DistillStats:
        """Distil on ``pool``: ``steps`` batches (default ``cfg.steps``; ``None``:
        one shuffled pass), then advance the epoch schedule."""
        steps = self.cfg.steps if steps is None else steps
        start = time.perf_counter()
        total = torch.zeros((), device=self.device)
        n = samples = 0
        while True:
            for batch in pool.batches(self.cfg.batch_size, generator=self.generator):
                total += self.step(batch)
                n += 1
                samples += batch.images.shape[0]
                if steps is not None and n >= steps:
                    break
            if steps is None or n >= steps or len(pool) == 0:
                break
        self.end_epoch()
        self.student.eval()
        return DistillStats(
            steps=n,
            samples=samples,
            mean_loss=float(total) / max(n, 1),
            seconds=time.perf_counter() - start,
        )
