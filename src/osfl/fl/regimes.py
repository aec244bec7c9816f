"""Regimes of one-shot FL and what clients upload.

The one-shot literature has split into regimes whose numbers cannot be
compared: client models trained from scratch (FAFI, Co-Boosting, DENSE, ...),
a frozen pretrained encoder with statistics or a generator (FALCON, FedCGS,
FedPFT, GH-OFL), and a pretrained generator on the server (FedLMG, OSCAR,
FedDEO). Each method declares its regime (``Method.card.regime``) and its upload
kind (``Method.card.uploads``); each record says which regime the run was really
in, and every table keeps one scoreboard per regime.
"""

from __future__ import annotations

__all__ = ["REGIMES", "UPLOAD_KINDS", "run_regime"]

#: What a method's numbers presuppose (one scoreboard per regime: results of
#: different regimes are never ranked together). A run's record says which one
#: it was in (:func:`run_regime`).
REGIMES: dict[str, str] = {
    "scratch": "client models trained from the run's initial weights",
    "pretrained": "clients fine-tune (part of) a pretrained model",
    "frozen_encoder": "a frozen pretrained encoder: clients upload statistics, tokens or heads",
    "generative_prior": "a pretrained generator on the server synthesises training data",
}

#: What a client sends the server, once or per round.
UPLOAD_KINDS: dict[str, str] = {
    "weights": "model parameters (all, or the trained part: a head, biases, adapters)",
    "weights+prototypes": "model parameters and per-class feature prototypes",
    "statistics": "per-class feature statistics (counts, moments, mixture parameters)",
    "synthetic_data": "synthetic feature/token sequences or the generator that makes them",
    "features": "intermediate features of the client's data, with their labels",
}


def run_regime(declared: str, pretrained_weights: bool) -> str:
    """The regime a run was really in: a method declared ``scratch`` whose model
    loaded pretrained weights ran ``pretrained``, and one declared
    ``pretrained`` run from random weights (a cpu-scale toy) ran ``scratch``."""
    if declared == "scratch" and pretrained_weights:
        return "pretrained"
    if declared == "pretrained" and not pretrained_weights:
        return "scratch"
    return declared
