"""FENS's options. The defaults are the authors' (``sacs-epfl/fens`` a349903):
``scripts/local_training.sh`` (the held-out share), ``generate_logits_v2.py``
(INT8 client models), ``scripts/train_aggregator.sh``, ``models/smallnn.py``,
``distoptim/FedAdam.py`` and ``train_LocalSGD.py`` (the aggregator and its FL
training). docs/methods/fens.md gives the line of each."""

from __future__ import annotations

from dataclasses import dataclass, field

from osfl.errors import ConfigError
from osfl.fl.optim import OptimConfig
from osfl.fl.server_optim import ServerOptConfig

__all__ = ["QUANTIZATIONS", "AggregatorLocalConfig", "FENSConfig"]

QUANTIZATIONS = ("none", "int8")


@dataclass(frozen=True)
class AggregatorLocalConfig(OptimConfig):
    """One client's training of the aggregator in one round: ``steps``
    optimiser steps on batches of ``batch_size`` of its held-out logits
    (successive batches of a fresh random order, reshuffled when used up),
    with the optimiser fields of :class:`~osfl.fl.optim.OptimConfig` (the
    schedule restarts every round). Authors: one step of plain SGD at lr 1,
    batch 128 (``train_aggregator.sh``: ``--lr 1 --lowE 1 --highE 1 --bs 128
    --momentum 0.0``; FedAdam's local step ignores weight decay)."""

    #: optimiser of a client's aggregator step
    optimizer: str = "sgd"
    #: its learning rate
    lr: float = 1.0
    #: its momentum
    momentum: float = 0.0
    #: batch of held-out logits per step
    batch_size: int = 128
    #: optimiser steps per client and round
    steps: int = 1

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as e:
            raise ConfigError(f"method.fens.local: {e}") from None
        if self.batch_size < 1 or self.steps < 1:
            raise ConfigError("method.fens.local: batch_size and steps must be >= 1")


@dataclass(frozen=True)
class FENSConfig:
    """``holdout``: the share of each client's data its model never trains on,
    whose logits alone train the aggregator (0: none held out; the models
    train on all the data and the aggregator learns from their logits on
    it). ``quantize``: ``int8`` uploads (and relays) the client models with
    INT8 weights, ``none`` in float32. ``rounds``: FL rounds of the aggregator
    after the one-shot upload; ``hidden_per_member``: its hidden units per
    client model (the authors' ``d``: K·d hidden units for K models);
    ``client_fraction``: clients per aggregator round after the first (which
    delivers the models, to everyone); ``local``: each client's training of it
    per round; ``server_opt``: how the server turns the round's combined
    aggregator into the next (FedAdam; ``server_opt.optimizer=fedavg`` with
    ``lr=1`` takes the combined one as it is)."""

    #: share of each client's data its model never trains on; trains the aggregator
    holdout: float = 0.1
    #: upload of the client models: int8 weights or none (float32)
    quantize: str = "int8"
    #: FL rounds of the aggregator after the one-shot upload
    rounds: int = 500
    #: aggregator hidden units per client model
    hidden_per_member: int = 2
    #: share of the clients in each aggregator round
    client_fraction: float = 1.0
    #: each client's training of the aggregator per round
    local: AggregatorLocalConfig = field(default_factory=AggregatorLocalConfig)
    #: the server's step from the round's combined aggregator (FedAdam)
    server_opt: ServerOptConfig = field(
        default_factory=lambda: ServerOptConfig(
            optimizer="fedadam", lr=1e-3, beta1=0.9, beta2=0.99, tau=1e-3
        )
    )

    def __post_init__(self) -> None:
        if not 0 <= self.holdout < 1:
            raise ConfigError(f"method.fens: holdout must lie in [0, 1), got {self.holdout}")
        if self.quantize not in QUANTIZATIONS:
            raise ConfigError(
                f"method.fens: quantize must be one of {QUANTIZATIONS}, got {self.quantize!r}"
            )
        if self.rounds < 1:
            raise ConfigError(f"method.fens: rounds must be >= 1, got {self.rounds}")
        if self.hidden_per_member < 1:
            raise ConfigError(
                f"method.fens: hidden_per_member must be >= 1, got {self.hidden_per_member}"
            )
        if not 0 < self.client_fraction <= 1:
            raise ConfigError(
                f"method.fens: client_fraction must be in (0, 1], got {self.client_fraction}"
            )
