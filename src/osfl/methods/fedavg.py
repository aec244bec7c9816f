"""FedAvg (one-shot and multi-round) and FedProx.

- FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks
  from Decentralized Data", AISTATS 2017 (Algorithm 1): each round a fraction
  of the clients trains the broadcast global weights for a few local epochs
  and the server averages the returned weights, weighted by sample counts.
  With ``rounds=1`` it is the *one-shot* FedAvg baseline of the one-shot FL
  papers (FedMITR, FALCON, FAFI, DENSE): long local training from a common
  initialisation, then a single data-size-weighted average. The one-shot
  clients come from the shared client cache (:func:`trained_client`), so
  Ensemble, Local and the distillation methods reuse them.
- FedProx: Li et al., "Federated Optimization in Heterogeneous Networks",
  MLSys 2020: FedAvg whose clients add ``mu/2 ||w - w_global||²`` to their loss
  (:class:`osfl.fl.objectives.ProximalTerm`).

BatchNorm running statistics are averaged like parameters (their
``num_batches_tracked`` counters by a rounded weighted mean), as in Flower's
``FedAvg`` which averages every array it receives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, SharedTraining
from osfl.fl.method import (
    Method,
    MethodCard,
    MultiRound,
    Predictor,
    Screening,
    SecureAggregation,
    SharedTrainingStep,
    SiteEvaluation,
    register_method,
    sample_fraction,
)
from osfl.fl.objectives import ObjectiveTerm, ProximalTerm
from osfl.fl.training import train_local
from osfl.fl.upload import Broadcast, Upload, UploadSpec
from osfl.methods.clients import (
    WEIGHTINGS,
    ModelPredictor,
    StateDict,
    combine_states,
    initial_state,
    model_from_state,
    model_upload,
    model_upload_spec,
    public_fl_hparams,
    sample_counts,
    state_broadcast,
    trained_client,
    update_norm_problem,
)


@dataclass(frozen=True)
class FedAvgConfig:
    """``rounds=1`` is one-shot FedAvg. Each round's local training follows
    the run's recipe (``train.*``; ``method_train.fedavg.epochs`` for FedAvg's
    clients alone)."""

    #: communication rounds (1: one-shot)
    rounds: int = 1
    #: share of the clients sampled each round
    client_fraction: float = 1.0
    #: how the server averages the clients: data_size (by sample counts) or uniform
    weighting: str = "data_size"

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if not 0.0 < self.client_fraction <= 1.0:
            raise ConfigError(f"client_fraction must lie in (0, 1], got {self.client_fraction}")
        WEIGHTINGS.get(self.weighting)  # unknown name -> ConfigError listing the valid ones


@register_method("fedavg")
class FedAvg(Method, MultiRound, Screening, SecureAggregation, SharedTrainingStep, SiteEvaluation):
    """Server state: the global state dict (CPU tensors)."""

    Config: ClassVar[type] = FedAvgConfig
    card: ClassVar[MethodCard] = MethodCard(
        summary=(
            "Averages the clients' trained weights, weighted by data size; one round by default "
            "(one-shot FedAvg)."
        ),
        paper=(
            'McMahan et al., "Communication-Efficient Learning of Deep Networks from '
            'Decentralized Data", AISTATS 2017'
        ),
        default_run=True,
        default_order=1,
        server_rule=True,
    )

    @property
    def rounds(self) -> int:
        return self.config.rounds

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        """A fraction ``client_fraction`` of the clients each round (Alg. 1's C)."""
        return sample_fraction(self.config.client_fraction, round, num_clients, rng)

    @property
    def one_shot_run(self) -> bool:
        """One round of plain local training: the shared, cached client models."""
        return self.rounds == 1 and not self.local_terms_active()

    def local_terms_active(self) -> bool:
        return False

    def local_terms(self, broadcast: Broadcast) -> tuple[ObjectiveTerm, ...]:
        return ()

    # --- protocol --------------------------------------------------------
    def init_state(self) -> StateDict:
        return initial_state(self.run)

    def broadcast(self, state: StateDict, round: int) -> Broadcast:
        return state_broadcast(state)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        if self.one_shot_run:
            model = trained_client(ctx, data, broadcast.tensors, self.run.train)
        else:
            model = model_from_state(self.run, broadcast.tensors)
            train_local(
                model,
                data,
                self.run.train,
                transform=self.run.train_transform,
                device=self.run.device,
                generator=ctx.generator,
                terms=self.local_terms(broadcast),
                progress=self.run.progress,
                description=f"client {ctx.client_id}: local training",
            )
        return model_upload(model, len(data))

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        if not self.one_shot_run:
            return None
        return SharedTraining(model_from_state(self.run, broadcast.tensors), self.run.train)

    def upload_spec(self, state: StateDict, round: int, client: int) -> UploadSpec:
        return model_upload_spec(state)

    @property
    def secure_weighting(self) -> str | None:
        """The weighted mean needs only the clients' weighted sum."""
        return self.config.weighting

    def global_weights(self, state: Any) -> StateDict:
        """The global model's weights in the server state (the state itself here)."""
        return state

    def screen(self, state: Any, round: int, client: int, upload: Upload) -> str | None:
        """``server.max_update_norm``: an update farther than that from the
        broadcast weights is refused (norm bounding; off by default)."""
        bound = self.run.server.max_update_norm
        return update_norm_problem(upload.tensors, self.global_weights(state), bound)

    def aggregate(self, state: StateDict, uploads: Mapping[int, Upload], round: int) -> StateDict:
        counts = sample_counts(uploads)
        clients = sorted(counts)
        weights = WEIGHTINGS.get(self.config.weighting)([counts[c] for c in clients])
        return combine_states(
            self.run, [uploads[c].tensors for c in clients], weights, state, round=round
        )

    def aggregate_mean(self, state: StateDict, mean: Upload, round: int) -> StateDict:
        """The clients' weighted mean is the new global model (SecAgg+ runs
        only with ``server.aggregator=mean``; the mean comes in the layout's
        dtypes, integer buffers rounded, as ``weighted_mean`` gives them)."""
        return {name: mean.tensors[name] for name in state}

    def predictor(self, state: StateDict) -> Predictor:
        return ModelPredictor(model_from_state(self.run, state))

    def release(self, state: StateDict) -> StateDict:
        return state  # the global model is what every site receives anyway

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp


@dataclass(frozen=True)
class FedProxConfig(FedAvgConfig):
    """FedAvg's options plus the proximal weight ``mu``; multi-round by default."""

    rounds: int = 10
    #: weight of the proximal term that pulls each client toward the round's global model
    mu: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.mu >= 0.0:
            raise ConfigError(f"mu must be >= 0, got {self.mu}")


@register_method("fedprox")
class FedProx(FedAvg):
    """FedAvg with the proximal term anchored at each round's global weights."""

    Config: ClassVar[type] = FedProxConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        FedAvg.card,
        summary=(
            "FedAvg whose clients are pulled toward the global model by a proximal term, for "
            "non-IID data."
        ),
        paper='Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020',
        one_shot=False,
        default_run=False,
        default_order=10,
        smoke=("method.fedprox.rounds=2", "method.fedprox.mu=0.1"),
    )

    def local_terms_active(self) -> bool:
        return self.config.mu > 0.0

    def local_terms(self, broadcast: Broadcast) -> tuple[ObjectiveTerm, ...]:
        return (ProximalTerm(broadcast.tensors, self.config.mu),)
