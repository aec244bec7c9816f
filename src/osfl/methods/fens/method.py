"""The FENS protocol: one upload of the client models, then FL rounds of the
aggregator over their held-out logits (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.data.loader import BatchIterator
from osfl.errors import UploadError
from osfl.fl.context import ClientContext, SharedTraining
from osfl.fl.method import (
    KeepsClientState,
    Method,
    MethodCard,
    MultiRound,
    Predictor,
    SharedTrainingStep,
    register_method,
    sample_fraction,
)
from osfl.fl.server_optim import server_step
from osfl.fl.upload import Broadcast, Upload, UploadSpec
from osfl.methods.clients import (
    combine_states,
    cpu_state,
    initial_state,
    model_from_state,
    model_upload_spec,
    sample_counts,
    trained_client,
)
from osfl.methods.fens.aggregator import (
    FENSPredictor,
    LogitAggregator,
    samples_seen,
    train_aggregator,
)
from osfl.methods.fens.config import FENSConfig
from osfl.methods.fens.holdout import split_client_data
from osfl.methods.fens.quantize import dequantize_int8, int8_spec, quantize_int8, quantized_keys

__all__ = ["FENS"]

MEMBER, AGG = "member.", "aggregator."
LOGITS, LABELS = "heldout_logits", "heldout_labels"


@register_method("fens")
class FENS(Method, MultiRound, KeepsClientState, SharedTrainingStep):
    """One-shot client models + an aggregator trained over FL rounds (see the
    package docstring). Server state: ``{"init", "members": {id: upload
    tensors, INT8 where quantised}, "num_samples": {id: n}, "aggregator":
    state | None, "server_opt": the server optimiser's moments}``."""

    Config: ClassVar[type] = FENSConfig
    card: ClassVar[MethodCard] = MethodCard(
        summary=(
            "Clients send INT8 models once, then train an aggregator of their outputs on "
            "held-out data in FL rounds."
        ),
        paper=(
            'Allouah et al., "Revisiting Ensembling in One-Shot Federated Learning", NeurIPS 2024'
        ),
        one_shot=False,
        server_rule=True,  # the aggregator's FL rounds combine with server.aggregator
        smoke=(
            "data.max_per_class=60",
            "partition.alpha=0.1",
            "method.fens.rounds=30",
            "method.fens.server_opt.lr=0.03",
        ),
    )
    config: FENSConfig

    @property
    def rounds(self) -> int:
        return 1 + self.config.rounds

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        if round <= 1:  # everyone uploads its model, and everyone receives the models
            return list(range(num_clients))
        return sample_fraction(self.config.client_fraction, round, num_clients, rng)

    # --- what every party can compute ---------------------------------------------
    @cached_property
    def int8_keys(self) -> tuple[str, ...]:
        """The weights an INT8 upload quantises (none without ``quantize=int8``)."""
        if self.config.quantize != "int8":
            return ()
        return quantized_keys(self.run.model.build_meta(self.run.num_classes))

    def split(self, ctx: ClientContext, data: ImageSet) -> tuple[ImageSet, ImageSet]:
        """``(train, held_out)`` of this client's data (:mod:`.holdout`)."""
        return split_client_data(data, self.config.holdout, self.run.seed, ctx.client_id)

    def training_share(self, ctx: ClientContext, data: ImageSet) -> ImageSet:
        return self.split(ctx, data)[0]

    def new_aggregator(self, members: int) -> LogitAggregator:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.run.seed)
            hidden = members * self.config.hidden_per_member
            return LogitAggregator(members, self.run.num_classes, hidden)

    def member_model(self, tensors: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        """A client model from its upload (dequantised when INT8)."""
        return model_from_state(self.run, dequantize_int8(tensors, self.int8_keys))

    # --- server state ---------------------------------------------------------------
    def init_state(self) -> dict[str, Any]:
        return {
            "init": initial_state(self.run),
            "members": {},
            "num_samples": {},
            "aggregator": None,
            "server_opt": {},
        }

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        if round == 0:
            return Broadcast(tensors=dict(state["init"]))
        tensors = {AGG + k: v for k, v in state["aggregator"].items()}
        if round == 1:  # the one delivery of the client models, as uploaded
            for c, member in state["members"].items():
                tensors.update({f"{MEMBER}{c}.{k}": v for k, v in member.items()})
        return Broadcast(tensors=tensors, meta={"members": sorted(state["members"])})

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        if round != 0:
            return None
        model = model_from_state(self.run, broadcast.tensors)
        return SharedTraining(model, self.run.train, select=self.training_share)

    # --- client side ------------------------------------------------------------------
    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        if ctx.round == 0:
            train = self.training_share(ctx, data)
            state = cpu_state(trained_client(ctx, train, broadcast.tensors))
            state = quantize_int8(state, self.int8_keys)
            return Upload(tensors=state, meta={"num_samples": len(train)})
        logits, labels = self.heldout_logits(ctx, broadcast, data)
        aggregator = self.new_aggregator(logits.shape[1])
        prefix = len(AGG)
        aggregator.load_state_dict(
            {k[prefix:]: v for k, v in broadcast.tensors.items() if k.startswith(AGG)}
        )
        train_aggregator(aggregator, logits, labels, self.config.local, ctx.generator)
        seen = samples_seen(len(labels), self.config.local)
        return Upload(tensors=cpu_state(aggregator), meta={"num_samples": seen})

    def heldout_logits(
        self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K client models' logits on this client's held-out data (n×K×C)
        and its labels: computed once, when the models arrive, and kept in the
        client's own state."""
        if LOGITS in ctx.state.tensors:
            return ctx.state.tensors[LOGITS], ctx.state.tensors[LABELS]
        ids = broadcast.meta.get("members")
        if not ids:
            raise UploadError(f"fens round {ctx.round}: no client models received yet")
        held = self.split(ctx, data)[1]
        if len(held) == 0:
            raise UploadError(f"fens: client {ctx.client_id} holds no data out for the aggregator")
        outs = []
        for c in ids:
            prefix = f"{MEMBER}{c}."
            member = {
                k[len(prefix) :]: v for k, v in broadcast.tensors.items() if k.startswith(prefix)
            }
            outs.append(self.logits_of(self.member_model(member), held, ctx.device))
        logits = torch.stack(outs, dim=1).cpu()
        ctx.state.tensors[LOGITS], ctx.state.tensors[LABELS] = logits, held.labels.clone()
        return logits, held.labels

    def logits_of(
        self, model: torch.nn.Module, data: ImageSet, device: torch.device
    ) -> torch.Tensor:
        """``model``'s float logits on ``data`` through the run's evaluation
        transform (no augmentation, as the authors' ``apply_augmentation=False``)."""
        model = model.to(device).eval()
        t = self.run.eval_transform
        batches = BatchIterator(data.images, data.labels, 256, shuffle=False, device=device)
        with torch.no_grad():
            return torch.cat(
                [model(t(xb) if t is not None else xb.float() / 255).float() for xb, _ in batches]
            )

    # --- uploads and aggregation --------------------------------------------------------
    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        if round == 0:
            keys = self.int8_keys
            ref = state["init"]
            return int8_spec(ref, keys) if keys else model_upload_spec(ref)
        return model_upload_spec(state["aggregator"])

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        counts = sample_counts(uploads)
        clients = sorted(counts)
        if round == 0:
            members = {c: dict(uploads[c].tensors) for c in clients}
            aggregator = cpu_state(self.new_aggregator(len(members)))
            return {**state, "members": members, "num_samples": counts, "aggregator": aggregator}
        total = sum(counts[c] for c in clients)
        weights = [counts[c] / total for c in clients]
        x = state["aggregator"]
        combined = combine_states(
            self.run, [uploads[c].tensors for c in clients], weights, x, round=round
        )
        aggregator, slots = server_step(self.config.server_opt, x, combined, state["server_opt"])
        return {**state, "aggregator": aggregator, "server_opt": slots}

    def predictor(self, state: dict[str, Any]) -> Predictor:
        ids = sorted(state["members"])
        aggregator = self.new_aggregator(len(ids))
        aggregator.load_state_dict(state["aggregator"])
        return FENSPredictor([self.member_model(state["members"][c]) for c in ids], aggregator)
