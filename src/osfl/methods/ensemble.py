"""Ensemble: the server keeps every client's locally trained model and
predicts with the average of their softmax outputs.

The standard upper reference of one-shot FL (Guha et al., "One-Shot Federated
Learning", 2019; the "Ensemble" row of DENSE, Co-Boosting, FedMITR and FALCON):
it costs one model upload per client but K forward passes at inference, which
is what distillation methods (FedDF, DENSE, ...) compress into one model. The
clients are exactly those of one-shot FedAvg (same cache key), so running
both trains each client once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.fl.method import MethodCard, Predictor, SiteEvaluation, register_method
from osfl.methods.clients import WEIGHTINGS, ClientModelsMethod


class EnsemblePredictor(Predictor):
    """Weighted mean of the members' softmax probabilities (B×K)."""

    def __init__(self, models: Sequence[nn.Module], weights: Sequence[float] | None = None):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        w = (
            torch.full((len(models),), 1.0 / len(models))
            if weights is None
            else torch.as_tensor(list(weights), dtype=torch.float32)
        )
        if w.shape != (len(models),) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise ValueError("ensemble weights must be one non-negative number per model")
        self.register_buffer("weights", w / w.sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = None
        for w, m in zip(self.weights, self.models, strict=True):
            p = w * torch.softmax(m(x).float(), dim=-1)
            out = p if out is None else out + p
        return out


@dataclass(frozen=True)
class EnsembleConfig:
    """``weighting``: ``uniform`` (the papers' default) or ``data_size``."""

    #: how the clients' outputs are averaged: uniform or data_size (by their sample counts)
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        WEIGHTINGS.get(self.weighting)  # unknown name -> ConfigError listing the valid ones


@register_method("ensemble")
class Ensemble(ClientModelsMethod, SiteEvaluation):
    Config: ClassVar[type] = EnsembleConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        ClientModelsMethod.card,
        summary=(
            "Keeps every client's model and predicts with the mean of their softmax outputs (K "
            "models to run)."
        ),
        paper='Guha et al., "One-Shot Federated Learning", 2019',
        default_run=True,
        default_order=2,
    )

    def predictor(self, state: dict[str, Any]) -> Predictor:
        ids, models = self.client_models(state)
        weights = WEIGHTINGS.get(self.config.weighting)([state["num_samples"][c] for c in ids])
        return EnsemblePredictor(models, weights.tolist())

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        """The members and their sample counts: the ensemble *is* every
        client's model, so every site that evaluates it sees them all."""
        return {"clients": state["clients"], "num_samples": state["num_samples"]}
