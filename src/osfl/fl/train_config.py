"""A client's local-training recipe (:class:`TrainConfig`).

Its own module, below the run context and the training loop, because both
need it: every party of a run knows the recipe before round 0
(:class:`~osfl.fl.context.RunContext`), and :func:`~osfl.fl.training.train_local`
follows it. The optimizer fields are :class:`~osfl.fl.optim.OptimConfig`'s,
shared with server-side distillation so that they are defined and checked once.
Local training follows FedAvg [McMahan et al., AISTATS 2017]: ``epochs`` local
epochs (or ``steps`` optimizer steps) of mini-batch training.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig


@dataclass(frozen=True)
class TrainConfig(OptimConfig):
    """The optimizer of :class:`OptimConfig` plus the loop's own knobs.

    ``steps`` (optimizer steps), when set, overrides ``epochs``. ``amp``
    autocasts on CUDA only (bf16 where supported, the default there: the
    record's ``provenance.dtype`` says which); on CPU it changes nothing.
    ``drop_last`` drops each epoch's last incomplete batch. ``compile`` runs
    the model's forward through ``torch.compile`` on CUDA (off: its compile
    time is only worth paying where a GPU measured it faster, and none has yet).
    """

    epochs: int = 1
    steps: int | None = None
    batch_size: int = 64
    amp: bool = True
    drop_last: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as e:
            raise ConfigError(f"train: {e}") from None
        if self.epochs < 1:
            raise ConfigError(f"train: epochs must be >= 1, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"train: steps must be >= 1 or null, got {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"train: batch_size must be >= 1, got {self.batch_size}")

    def total_steps(self, num_samples: int) -> int:
        """Optimizer steps for a client holding ``num_samples`` samples."""
        if self.steps is not None:
            return self.steps
        return self.epochs * self.batches_per_epoch(num_samples)

    def batches_per_epoch(self, num_samples: int) -> int:
        if self.drop_last:
            return num_samples // self.batch_size
        return math.ceil(num_samples / self.batch_size)

    def public_hparams(self) -> dict[str, Any]:
        """What an honest-but-curious server knows of local training (Observations).

        ``momentum`` is the momentum actually applied (0 for sgd/adam/adamw).
        """
        d = asdict(self)
        d["momentum"] = self.applied_momentum
        return d
