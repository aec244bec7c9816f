"""Recording what the server saw for an audit: Observations with the scheme
history (through the method's declared
:meth:`~osfl.fl.method.Method.audit_history`) and the labels each local step
used as the ground truth."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from osfl.fl.observers import ObservationRecorder

if TYPE_CHECKING:
    from osfl.fl.context import RunContext
    from osfl.fl.method import Method

log = logging.getLogger(__name__)


def observation_hparams(method: Method, run: RunContext) -> dict[str, Any]:
    """The public hyper-parameters of an Observation: the method's (``train``,
    ``fl`` scheme constants such as ``mu``/``alpha``/``option``, ``defense``)
    plus the architecture (``model`` = {name, kwargs}) and ``num_classes``,
    so that attacks can rebuild the model without the simulator."""
    hp = dict(method.public_hparams())
    hp["model"] = {"name": run.model.name, "kwargs": dict(run.model.kwargs)}
    hp["num_classes"] = int(run.num_classes)
    return hp


def audit_truth(
    truth: Mapping[str, Any] | None, hparams: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The labels each local step used (RLU scores ``m * |B|`` labels).

    The simulation records them (``label_source="steps"``). When it could only
    give the client's data labels (a cache hit), full-epoch training without
    ``drop_last`` used each sample exactly ``epochs`` times, so the data labels
    repeated ``epochs`` times are the exact multiset; otherwise the truth is
    marked ``approximate``.
    """
    if truth is None or "labels" not in truth:
        return None
    out = dict(truth)
    if out.get("label_source", "data") == "steps":
        return out
    train = hparams.get("train") or {}
    epochs, steps, drop = train.get("epochs"), train.get("steps"), train.get("drop_last", False)
    if steps is None and not drop and isinstance(epochs, int) and epochs >= 1:
        out["labels"] = torch.as_tensor(truth["labels"]).repeat(epochs)
        out["label_source"] = "data_x_epochs"
    else:
        out["approximate"] = True
        log.warning("audit truth is the client's data labels, not its step labels (approximate)")
    return out


class AuditRecorder(ObservationRecorder):
    """An :class:`~osfl.fl.observers.ObservationRecorder` whose hyper-parameters
    name the architecture (so attacks rebuild the model without the simulator)
    and whose truth is the labels each local step used (:func:`audit_truth`).
    The scheme history comes from the method's declared
    :meth:`~osfl.fl.method.Method.audit_history`, as for any recorder."""

    def __init__(
        self,
        method: Method,
        run: RunContext,
        dir: str | Path | None = None,
        clients: Sequence[int] | None = None,
        rounds: Sequence[int] | None = None,
    ):
        super().__init__(observation_hparams(method, run), dir, clients, rounds, method=method)

    def prepare_truth(self, truth: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return audit_truth(truth, self.hparams or {})
