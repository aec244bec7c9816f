"""FedDF: ensemble distillation on unlabelled public data (method ``feddf``).

Lin et al., "Ensemble Distillation for Robust Model Fusion in Federated
Learning", NeurIPS 2020 (Algorithm 1), in its one-shot form: the server model
starts from the clients' FedAvg and is trained for ``distill.steps`` steps on
batches of an *unlabelled public* data set to match the clients' ensemble,
``KL(softmax(mean_k f_k(x)) || softmax(s(x)))`` (logits averaged, T = 1),
with Adam at lr 1e-3 and cosine annealing (the paper's server optimiser;
its early stopping on a validation split is not implemented: a fixed step
budget is used instead).

The public data is the ``public`` option (an osfl data spec, e.g.
``imagefolder:data/cifar10``; ``public_split`` picks its train or
test split, ``public_max_per_class`` subsamples it); it must be disjoint from
the clients' data — that is the user's responsibility (the paper uses
CIFAR-100 or STL-10 for CIFAR-10 clients). Public images get the run's
*training* augmentation. Without public data the method stops with a clear
error: FedDF is not data-free.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.loader import BatchIterator
from osfl.data.sources import load_data
from osfl.errors import ConfigError, DataError
from osfl.fl.method import MethodCard, register_method
from osfl.methods.kd.base import (
    WEAK_FEDAVG_TASK,
    DistillationMethod,
    KDConfig,
    ServerSide,
    epoch_log,
)
from osfl.methods.kd.distill import DistillConfig, Distiller
from osfl.methods.kd.pool import PoolBatch
from osfl.methods.kd.teacher import EnsembleTeacher

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
NO_PUBLIC = (
    "feddf needs unlabelled public data on the server: set method.feddf.public to a data spec "
    "(e.g. imagefolder:<dir>) holding images the clients do not have; for a data-free "
    "server use dense, coboosting or deepinversion"
)


def _default_distill() -> DistillConfig:
    # Lin et al.'s server optimiser: Adam lr 1e-3 with cosine annealing, 10k steps
    return DistillConfig(
        optimizer="adam", lr=1e-3, weight_decay=0.0, schedule="cosine", steps=10000
    )


@dataclass(frozen=True)
class FedDFConfig(KDConfig):
    """FedDF's server recipe; ``distill.steps`` is the total number of
    distillation steps on the public data (the cosine schedule spans them)."""

    init: str = "fedavg"
    epochs: int = 1
    distill: DistillConfig = field(default_factory=_default_distill)
    #: the unlabelled public data the server distils on, a data spec (required)
    public: str | None = None
    #: split of that data set used: train or test
    public_split: str = "train"
    #: cap on the public images per class (null: all)
    public_max_per_class: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distill.steps is None:
            raise ConfigError(
                "method.feddf: distill.steps must be set (the number of distillation steps)"
            )
        if self.public_split not in SPLITS:
            raise ConfigError(
                f"method.feddf: public_split must be train or test, got {self.public_split!r}"
            )


def load_public(cfg: FedDFConfig, side: ServerSide) -> ImageSet:
    """The ``public`` data spec's images at the run's image shape."""
    if cfg.public is None:
        raise ConfigError(NO_PUBLIC)
    c, h, _ = side.image_shape
    opts: dict[str, object] = {"image_size": h, "channels": c}
    if cfg.public_max_per_class is not None:
        opts["max_per_class"] = cfg.public_max_per_class
    splits = load_data(cfg.public, **opts)
    return splits.train if cfg.public_split == "train" else splits.test


@register_method("feddf")
class FedDF(DistillationMethod):
    """Ensemble distillation of the clients into their FedAvg on public data."""

    Config: ClassVar[type] = FedDFConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "Distils the client ensemble into their FedAvg model on unlabelled public images you "
            "provide (method.feddf.public)."
        ),
        paper=(
            'Lin et al., "Ensemble Distillation for Robust Model Fusion in Federated Learning", '
            "NeurIPS 2020"
        ),
        smoke=(
            *WEAK_FEDAVG_TASK,
            "method.feddf.public=digits",
            "method.feddf.public_split=test",
            "method.feddf.distill.steps=60",
        ),
    )

    def check(self) -> None:
        """FedDF is not data-free: without public data it stops before any client trains."""
        if self.config.public is None:
            raise ConfigError(NO_PUBLIC)

    def transfer_set(self, side: ServerSide) -> ImageSet:
        """The unlabelled images the server distils on: the ``public`` data here;
        a generative-prior method synthesises them instead."""
        return load_public(self.config, side)

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg: FedDFConfig = self.config
        public = self.transfer_set(side)
        if tuple(public.image_shape) != tuple(side.image_shape):
            raise DataError(
                f"public data has images of shape {tuple(public.image_shape)}, the run "
                f"{tuple(side.image_shape)}: load it at the run's image_size and channels"
            )
        steps = int(cfg.distill.steps or 1)
        distiller = Distiller(
            student,
            teacher,
            cfg.distill,
            epochs=steps,
            device=side.device,
            generator=side.generator,
        )
        loader = BatchIterator(
            public.images,
            public.labels,
            cfg.distill.batch_size,
            shuffle=True,
            generator=side.generator,
            device=side.device,
        )
        transform = self.run.train_transform
        done, running = 0, 0.0
        bar = self.run.progress.task(f"{self.name}: distillation steps", steps)
        with side.timer.phase("distillation"), bar:
            while done < steps:
                for xb, _ in loader:
                    x = transform(xb, side.generator)
                    unlabelled = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
                    loss = distiller.step(PoolBatch(x, unlabelled))
                    distiller.end_epoch()  # the cosine schedule runs over steps here
                    running += float(loss)
                    done += 1
                    if done % max(1, steps // 10) == 0 or done == steps:
                        epoch_log(self.name, done - 1, steps, kd_loss=running / done)
                    bar.advance()
                    if done >= steps:
                        break
        log.info("%s: %d steps on %d transfer images", self.name, done, len(public))
        return student
