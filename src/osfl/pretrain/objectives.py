"""Upstream training objectives: a registry, the common interface, and the
supervised one.

An :class:`Objective` is an ``nn.Module`` that holds the encoder being trained
plus whatever else the objective trains or keeps (DINO's projection head and
EMA teacher, MAE's decoder), and turns one batch of upstream images into a
loss. :func:`osfl.pretrain.train.pretrain` hands it to the project's local
training loop (:func:`osfl.fl.training.train_local`) as the model, with
:meth:`Objective.train_loss` as the loss function and :meth:`Objective.term` as the
objective term whose hooks run before and after every optimiser step, so the
optimiser, schedule, gradient clipping, AMP and progress bar are the ones every
FL client uses.

Objectives are registered by name (:data:`OBJECTIVES`): ``supervised`` (here),
``dino`` (:mod:`osfl.pretrain.dino`) and ``mae`` (:mod:`osfl.pretrain.mae`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import Transform, build_transform
from osfl.errors import ConfigError
from osfl.fl.objectives import ObjectiveTerm
from osfl.pretrain.config import PretrainConfig
from osfl.registry import Registry

#: Images per forward pass when evaluating on the held-out set.
EVAL_BATCH = 256


@dataclass(frozen=True)
class ObjectiveContext:
    """What an objective needs to know besides its options.

    ``mean``/``std`` are the upstream train set's channel statistics (every
    view is normalised with them); ``steps_per_epoch``/``total_steps`` drive
    per-step schedules (DINO's teacher momentum and temperature);
    ``generator`` draws every augmentation and mask, so a seed fixes the run.
    """

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    steps_per_epoch: int
    total_steps: int
    generator: torch.Generator
    device: torch.device


class _Hooks(ObjectiveTerm):
    """Adapter: the training loop's step hooks call the objective's."""

    name = "pretrain-objective"

    def __init__(self, objective: Objective):
        self.objective = objective

    def before_step(self, model: nn.Module) -> None:
        self.objective.before_step()

    def after_step(self, model: nn.Module) -> None:
        self.objective.after_step()


class Objective(nn.Module):
    """Base class. Subclasses set ``name``, build their modules in ``__init__``
    and implement :meth:`options_from`, :meth:`loss` and :meth:`evaluate`.

    ``trains_head``: the encoder's classifier head is trained on the upstream
    labels (supervised); otherwise :func:`~osfl.pretrain.train.pretrain` fits a
    linear probe as the head.
    """

    name: ClassVar[str] = "objective"
    trains_head: ClassVar[bool] = False

    @staticmethod
    def options_from(cfg: PretrainConfig) -> Any:
        """The block of ``cfg`` holding this objective's options."""
        raise NotImplementedError

    def __init__(self, model: nn.Module, options: Any, ctx: ObjectiveContext):
        super().__init__()
        self.model = model
        self.options = options
        self.ctx = ctx
        self.losses: list[torch.Tensor] = []  # per training step, on the device (no sync)
        self.step = 0

    # -- training --------------------------------------------------------
    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Training loss of one batch: ``x`` float images in [0, 1], ``y`` labels."""
        raise NotImplementedError

    def train_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` in the ``loss_fn(model, x, y)`` form the training loop
        calls, recording each step's loss for the per-epoch history."""
        out = self.loss(x, y)
        self.losses.append(out.detach())
        return out

    def term(self) -> ObjectiveTerm:
        """The objective term the training loop runs the step hooks of."""
        return _Hooks(self)

    def before_step(self) -> None:
        """After backward, before clipping and the optimiser step."""

    def after_step(self) -> None:
        """After the optimiser step (EMA updates, schedules)."""
        self.step += 1

    def epoch_losses(self) -> list[float]:
        """Mean training loss of each epoch (one host sync)."""
        if not self.losses:
            return []
        per_step = torch.stack(self.losses).float().cpu()
        spe = self.ctx.steps_per_epoch
        return [float(per_step[i : i + spe].mean()) for i in range(0, len(per_step), spe)]

    # -- results ---------------------------------------------------------
    def encoder(self) -> nn.Module:
        """The network whose weights are written (DINO: the teacher's backbone)."""
        return self.model

    @torch.no_grad()
    def evaluate(self, held_out: ImageSet) -> dict[str, float]:
        """Held-out metrics of the finished encoder (``loss`` at least)."""
        raise NotImplementedError


#: name -> Objective subclass
OBJECTIVES: Registry[type[Objective]] = Registry("pretraining objective")


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Class decorator: register ``cls`` under ``cls.name``."""
    OBJECTIVES.add(cls.name, cls)
    return cls


def batches(
    data: ImageSet, device: torch.device, size: int = EVAL_BATCH
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(float images in [0, 1], labels)`` of ``data`` in order, on ``device``."""
    for i in range(0, len(data), size):
        x = data.images[i : i + size].to(device).float().div_(255.0)
        yield x, data.labels[i : i + size].to(device)


@register_objective
class Supervised(Objective):
    """Cross-entropy on the upstream labels (the way ImageNet-pretrained ViTs
    are made: Dosovitskiy et al., ICLR 2021; DeiT, Touvron et al., ICML 2021),
    with the ``supervised.augment`` pipeline. Held-out: accuracy and loss."""

    name = "supervised"
    trains_head = True

    @staticmethod
    def options_from(cfg: PretrainConfig) -> Any:
        return cfg.supervised

    def __init__(self, model: nn.Module, options: Any, ctx: ObjectiveContext):
        super().__init__(model, options, ctx)
        head = model.get_classifier()  # type: ignore[operator]
        if not isinstance(head, nn.Linear) or head.out_features != ctx.num_classes:
            raise ConfigError(
                f"supervised pretraining needs a linear {ctx.num_classes}-class head, "
                f"the model has {head}"
            )
        self.augment: Transform = build_transform(
            options.augment, image_size=ctx.image_size, mean=ctx.mean, std=ctx.std
        )
        self.plain: Transform = build_transform(
            "none", image_size=ctx.image_size, mean=ctx.mean, std=ctx.std
        )

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(self.augment(x, self.ctx.generator))
        return F.cross_entropy(logits, y, label_smoothing=self.options.label_smoothing)

    @torch.no_grad()
    def evaluate(self, held_out: ImageSet) -> dict[str, float]:
        self.model.eval()
        correct = total = 0
        loss_sum = 0.0
        for x, y in batches(held_out, self.ctx.device):
            logits = self.model(self.plain(x))
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            total += int(y.numel())
        return {"accuracy": correct / total, "loss": loss_sum / total}
