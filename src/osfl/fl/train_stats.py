"""What one local training did and what it says about itself.

:class:`TrainStats` is the record of one client's local training, kept by a
:class:`StepTally` that both training loops share (the per-client
:func:`osfl.fl.training.train_local` and the batched
:func:`osfl.fl.batched_training.train_batched`), so that their statistics are
summed and read alike. :func:`training_health` judges a finished training
(diverged, unstable, underfitted) within its :func:`training_scope`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TrainStats:
    """What one call of :func:`train_local` did. ``first_loss`` / ``final_loss``:
    the mean loss of the first and of the last epoch (or of as many steps);
    ``train_accuracy``: the accuracy on the client's own batches during the
    last epoch (``None`` for a custom ``loss_fn``); ``warnings``: what looked
    wrong (:func:`training_health`, in the active :func:`training_scope`)."""

    steps: int
    samples: int
    epochs: float
    mean_loss: float
    last_loss: float
    seconds: float
    first_loss: float = math.nan
    final_loss: float = math.nan
    train_accuracy: float | None = None
    warnings: tuple[str, ...] = ()
    num_classes: int | None = None  # the width of the logits (None for a custom loss_fn)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: A client whose whole training (a one-shot upload) ends less than this fraction of the
#: way from chance to 100% accuracy on its own training batches has not fitted its data:
#: 32.5% for 10 classes, 50% for 3 (chance is 1/C for C classes).
MIN_SKILL = 0.25
#: A loss that rose by less than this fraction is noise (fresh masks and augmentations
#: every epoch, a learning rate too small to move it), not a warning.
LOSS_RISE_TOLERANCE = 0.05
#: The remedy for a loss that diverged or rose from the start.
LR_HINT = "lower the learning rate (train.lr) or set train.grad_clip"
#: The remedy for a client that trained stably but did not fit its data.
UNDERFIT_HINT = "train longer (train.epochs) or raise the learning rate (train.lr)"


@dataclass(frozen=True)
class TrainingScope:
    """Where a local training sits in its method: ``round`` of a one-round or
    a ``multi_round`` method.

    One round of a multi-round method is one piece of the federation's
    training: it is not expected to fit the client's data (the global model
    learns over the rounds), and from round 1 on it starts from a global model
    fitted to other clients, so its loss may rise on the way to this client's
    data (client drift). Such a training is judged only for divergence.
    """

    round: int = 0
    multi_round: bool = False

    @property
    def from_global_model(self) -> bool:
        """Starts from a model the federation trained (drift is expected)."""
        return self.multi_round and self.round > 0


_SCOPE: ContextVar[TrainingScope | None] = ContextVar("osfl_training_scope", default=None)


@contextmanager
def training_scope(round: int, *, multi_round: bool) -> Iterator[TrainingScope]:
    """Local training run inside the block is ``round`` of a one-round or a
    ``multi_round`` method (the runtimes' client turns set it; outside one, a
    training is a client's whole training and is judged as one)."""
    scope = TrainingScope(round=round, multi_round=multi_round)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def training_health(
    first_loss: float,
    final_loss: float,
    train_accuracy: float | None,
    epochs: float,
    *,
    num_classes: int | None = None,
    scope: TrainingScope | None = None,
) -> tuple[str, ...]:
    """What a finished local training says about itself, each symptom with its remedy.

    - a loss that is not finite: diverged (:data:`LR_HINT`);
    - a loss that rose from the first epoch to the last by more than
      :data:`LOSS_RISE_TOLERANCE`: unstable (:data:`LR_HINT`), unless the
      training started from a global model (round >= 1 of a multi-round
      method: client drift) and ended below chance level (``ln C``, the loss
      of a uniform guess over ``num_classes``);
    - a client's whole training (not one round of several) whose accuracy on
      its own batches stayed within :data:`MIN_SKILL` of chance (``1/C``):
      underfitted (:data:`UNDERFIT_HINT`).

    ``scope`` defaults to the active :func:`training_scope`. Training for a
    fraction of an epoch is not judged.
    """
    scope = scope or _SCOPE.get() or TrainingScope()
    if not (math.isfinite(first_loss) and math.isfinite(final_loss)):
        return (f"local training diverged (loss {final_loss}); {LR_HINT}",)
    found = []
    rose = epochs >= 2 and final_loss > first_loss * (1 + LOSS_RISE_TOLERANCE)
    if rose:
        found += _rise_symptom(first_loss, final_loss, num_classes, scope)
    whole = not rose and not scope.multi_round and epochs >= 1
    if whole and train_accuracy is not None:
        found += _underfit_symptom(train_accuracy, num_classes, epochs)
    return tuple(found)


def _rise_symptom(
    first_loss: float, final_loss: float, num_classes: int | None, scope: TrainingScope
) -> list[str]:
    """The risen loss as a symptom, unless the training started from a
    global model (client drift) and still ended below chance level."""
    chance_loss = math.log(num_classes) if num_classes and num_classes > 1 else None
    above_chance = chance_loss is not None and final_loss >= chance_loss
    if not above_chance and scope.from_global_model:
        return []
    level = (
        f", above chance level ({chance_loss:.3g} for {num_classes} classes)"
        if above_chance
        else ""
    )
    return [
        f"the local loss rose from {first_loss:.3g} (first epoch) to {final_loss:.3g} "
        f"(last){level}; {LR_HINT}"
    ]


def _underfit_symptom(train_accuracy: float, num_classes: int | None, epochs: float) -> list[str]:
    """Underfitting: an accuracy on its own batches within :data:`MIN_SKILL`
    of chance (``1/C``); not judged without at least two classes."""
    if num_classes is None or num_classes <= 1:
        return []
    chance = 1 / num_classes
    if train_accuracy < chance + MIN_SKILL * (1 - chance):  # (a NaN accuracy is not judged)
        return [
            f"did not fit its own data: {100 * train_accuracy:.0f}% accuracy on its "
            f"training batches in the last epoch (chance {100 * chance:.0f}% for "
            f"{num_classes} classes) after {epochs:.3g} epochs; {UNDERFIT_HINT}"
        ]
    return []


def stats_health(stats: Mapping[str, Any]) -> tuple[str, ...]:
    """:func:`training_health` of a stored :meth:`TrainStats.as_dict` (a client-cache
    hit), judged in the active :func:`training_scope`; an entry without the numbers
    keeps the warnings it was stored with."""
    try:
        return training_health(
            float(stats["first_loss"]),
            float(stats["final_loss"]),
            None if stats.get("train_accuracy") is None else float(stats["train_accuracy"]),
            float(stats["epochs"]),
            num_classes=stats.get("num_classes"),
        )
    except (KeyError, TypeError, ValueError):
        return tuple(str(w) for w in stats.get("warnings") or ())


class StepTally:
    """One client's running sums over its local steps, on the device (read
    once at the end, one wait for a GPU): the loss of every step, of the first
    epoch's and the last epoch's, and the last epoch's accuracy (cross-entropy
    only: a step without logits counts no accuracy)."""

    def __init__(self, total: int, per_epoch: int, device: torch.device):
        self.total, self.per_epoch = total, per_epoch
        self.loss_sum = torch.zeros((), device=device)
        self.first = torch.zeros((), device=device)  # loss summed over the first epoch's steps
        self.final = torch.zeros((), device=device)  # ... over the last epoch's
        self.correct = torch.zeros((), dtype=torch.int64, device=device)  # last epoch, CE only
        self.last = self.loss_sum
        self.seen = self.samples = 0
        self.num_classes: int | None = None

    def add(
        self, step: int, loss: torch.Tensor, logits: torch.Tensor | None, y: torch.Tensor
    ) -> None:
        """Step ``step``'s (detached) loss, logits (``None``: a custom loss) and labels."""
        self.loss_sum += loss
        self.last = loss
        if step < self.per_epoch:
            self.first += loss
        if step >= self.total - self.per_epoch:
            self.final += loss
            if logits is not None:
                self.correct += (logits.argmax(dim=1) == y).sum()
                self.seen += y.shape[0]
                self.num_classes = logits.shape[-1]
        self.samples += y.shape[0]

    def stats(self, steps: int, epochs: float, seconds: float) -> TrainStats:
        """The :class:`TrainStats` of ``steps`` steps, judged by :func:`training_health`."""
        # one read of the five device sums (one wait for a GPU, not five); float64
        # holds each float32 sum and int64 count exactly, so the numbers are those
        # of reading them one by one
        sums = [self.first, self.final, self.correct, self.loss_sum, self.last]
        first, final, correct, loss_sum, last = torch.stack([t.double() for t in sums]).tolist()
        first_loss, final_loss = first / self.per_epoch, final / self.per_epoch
        accuracy = correct / self.seen if self.seen else None
        return TrainStats(
            steps=steps,
            samples=self.samples,
            epochs=epochs,
            mean_loss=loss_sum / max(steps, 1),
            last_loss=last,
            seconds=seconds,
            first_loss=first_loss,
            final_loss=final_loss,
            train_accuracy=accuracy,
            warnings=training_health(
                first_loss, final_loss, accuracy, epochs, num_classes=self.num_classes
            ),
            num_classes=self.num_classes,
        )
