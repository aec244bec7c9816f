"""Local: every client keeps its own model — the floor of one-shot FL.

Each client's locally trained model (the same cached models one-shot FedAvg
and Ensemble use) is evaluated on the global test set and the *mean client
accuracy* is reported (:class:`~osfl.fl.method.PerClientPredictor`): what a
client gets without federating at all, the lower reference row of the
one-shot FL papers (e.g. FedMITR Table 1, FAFI Table 2).

The upload is still made and counted: it is what a server would receive if
the clients' models were collected, so the byte column stays comparable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from osfl.fl.method import MethodCard, PerClientPredictor, Predictor, register_method
from osfl.methods.clients import ClientModelsMethod


@dataclass(frozen=True)
class LocalConfig:
    """No options: local training itself is the run's ``train`` config."""


@register_method("local")
class Local(ClientModelsMethod):
    Config: ClassVar[type] = LocalConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        ClientModelsMethod.card,
        summary=(
            "Each client keeps its own model; reports the mean accuracy of the clients' models "
            "(the floor)."
        ),
        default_run=True,
        default_order=0,
    )

    def predictor(self, state: dict[str, Any]) -> Predictor:
        _, models = self.client_models(state)
        return PerClientPredictor(models)
