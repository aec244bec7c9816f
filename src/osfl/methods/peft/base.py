"""The machinery of the parameter-efficient FedAvg baselines (EFTViT Table 1).

Every baseline trains a *subset* of a (pretrained) ViT's parameters on the
clients and averages only that subset on the server, FedAvg-style [McMahan
et al., AISTATS 2017, Alg. 1]: the frozen rest is the common starting model
every party builds from the run config alone (the pretrained checkpoint, or
the run's seeded initial weights), so it never crosses the network.

- :class:`FrozenBase`: that common model, built once per process (under a
  lock: it is the only step that draws from the global torch RNG) and then
  deep-copied for every client without drawing random numbers, so
  thread-parallel clients stay deterministic.
- :class:`PEFTMethod` (a :class:`~osfl.methods.fedavg.FedAvg`): the server
  state is the global values of the trainable tensors; the broadcast carries
  them; a client loads them into the frozen base, trains exactly its
  trainable set (:meth:`PEFTMethod.client_names`) and uploads exactly that
  set; the server averages every tensor over the clients that uploaded it
  (:func:`holder_average`: plain FedAvg when all clients train the same set,
  FedRA's per-layer average when they do not) and keeps the others.
- :class:`SubsetViT`: a ViT that runs only some of its blocks, in a given
  order (FedRA's random layer allocation, FEDBFPT's sampled deeper layers).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, RunContext
from osfl.fl.method import MethodCard, Predictor, Reporting
from osfl.fl.seeds import derive_seed
from osfl.fl.training import init_model, train_local
from osfl.fl.upload import NUM_SAMPLES, Broadcast, TensorSpec, Upload, UploadSpec
from osfl.methods.clients import (
    WEIGHTINGS,
    ModelPredictor,
    StateDict,
    average_states,
    sample_counts,
)
from osfl.methods.fedavg import FedAvg, FedAvgConfig
from osfl.methods.peft.flops import forward_gflops, trainable_parameters
from osfl.methods.peft.lora import set_dropout_generator
from osfl.models.vit import VisionTransformer, pool_tokens


class FrozenBase:
    """The common starting model of a run: :func:`~osfl.fl.training.init_model`
    (the pretrained checkpoint when ``model.kwargs.pretrained`` is set, else the
    run seed's initial weights) — what every party can build before round 0.

    Built once per process (under a lock: :func:`init_model` is the one step
    that seeds the global torch RNG); every later model is a deep copy of it,
    which draws no random number."""

    def __init__(self, run: RunContext):
        self.run = run
        self._template: nn.Module | None = None
        self._lock = threading.Lock()

    def template(self) -> nn.Module:
        """The base model itself (read-only: copy it with :meth:`build`)."""
        with self._lock:
            if self._template is None:
                self._template = init_model(self.run).to("cpu").eval()
            return self._template

    def state(self) -> StateDict:
        """The base weights (CPU; shared with the template: clone before changing)."""
        return {k: v.detach() for k, v in self.template().state_dict().items()}

    def build(self) -> nn.Module:
        """A fresh model holding the base weights (CPU, train mode)."""
        return copy.deepcopy(self.template()).train()


def peft_smoke(name: str, *extra: str) -> tuple[str, ...]:
    """The ``smoke`` overrides of a PEFT baseline: a 2-block, 64-wide ViT with
    4-px patches on the 8-px digits, AdamW, two rounds of every client."""
    return (
        "model.name=vit_tiny_patch2_16",
        "model.kwargs={patch_size: 4, depth: 2, embed_dim: 64, num_heads: 2}",
        "train.optimizer=adamw",
        "train.lr=0.003",
        f"method.{name}.rounds=2",
        f"method.{name}.client_fraction=1.0",
        *extra,
    )


class SubsetViT(nn.Module):
    """``vit`` running only the blocks ``blocks`` (indices, in that order,
    repeats allowed), then its norm, pooling and head. Shares every parameter
    with ``vit``; its ``state_dict`` is ``vit.*``."""

    def __init__(self, vit: VisionTransformer, blocks: Sequence[int]):
        super().__init__()
        depth = len(vit.blocks)
        if not blocks or any(not 0 <= b < depth for b in blocks):
            raise ConfigError(f"block indices {list(blocks)} must lie in [0, {depth})")
        self.vit = vit
        self.block_ids = tuple(int(b) for b in blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vit = self.vit
        t = vit.embed(x)
        for b in self.block_ids:
            t = vit.blocks[b](t)
        f = pool_tokens(vit.norm(t), vit.global_pool, vit.fc_norm, vit.num_prefix_tokens)
        return vit.forward_head(f)


def holder_average(
    uploads: Mapping[int, Mapping[str, torch.Tensor]], weights: Mapping[int, float]
) -> StateDict:
    """Per tensor name, the weighted average over the clients whose upload holds
    it (weights renormalised among them); names nobody uploaded are absent."""
    names = sorted({k for t in uploads.values() for k in t})
    out: StateDict = {}
    for name in names:
        holders = [c for c in sorted(uploads) if name in uploads[c]]
        avg = average_states(
            [{name: uploads[c][name]} for c in holders], [weights[c] for c in holders]
        )
        out[name] = avg[name]
    return out


@dataclass(frozen=True)
class PEFTConfig(FedAvgConfig):
    """FedAvg's options with EFTViT's setting (§4.2) as defaults: ~100 rounds
    and a sampled fraction of the clients per round (the fraction is lost from
    our copy of the paper; 0.1 of 100 clients is FedAvg's C = 0.1)."""

    rounds: int = 100
    client_fraction: float = 0.1


class PEFTMethod(FedAvg, Reporting):
    """FedAvg over a trainable subset of the parameters (see the module docstring).

    Subclasses choose the trainable set (:meth:`is_trainable`) and may add
    adapter modules (:meth:`adapt`, :meth:`reset_adapters`); FedRA and FEDBFPT
    also vary the set per client or round (:meth:`client_names`,
    :meth:`global_names`) and train a view of the model (:meth:`client_view`).
    """

    card: ClassVar[MethodCard] = dataclasses.replace(
        FedAvg.card,
        server_rule=False,  # each tensor averaged over its holders (holder_average)
        regime="pretrained",
        one_shot=False,
        default_run=False,
        default_order=40,
    )

    Config: ClassVar[type] = PEFTConfig
    needs_vit: ClassVar[bool] = False

    def __init__(self, config: Any, run: RunContext):
        super().__init__(config, run)
        self.base = FrozenBase(run)
        self._meta: nn.Module | None = None

    # --- what a subclass chooses -------------------------------------------
    def adapt(self, model: nn.Module) -> None:
        """Add adapter modules to ``model`` in place (no random draws)."""

    def reset_adapters(self, model: nn.Module, generator: torch.Generator) -> None:
        """Draw the adapters' initial values (on the server, once)."""

    def is_trainable(self, name: str) -> bool:
        raise NotImplementedError

    def head_prefix(self) -> str:
        """``head.`` for a ViT (the classifier's module name + ``.``)."""
        return self.meta_model().classifier_name + "."

    # --- structure -------------------------------------------------------------
    def meta_model(self) -> nn.Module:
        """The adapted architecture (for names and shapes; values not meaningful), built once."""
        if self._meta is None:
            model = self.base.build()
            self.adapt(model)
            self._meta = model
        return self._meta

    def build_model(self) -> nn.Module:
        """The frozen base with the adapters (adapter values not yet set)."""
        model = self.base.build()
        self.adapt(model)
        return model

    def trainable_names(self) -> list[str]:
        """Every parameter name this method ever trains, in model order."""
        return [n for n, _ in self.meta_model().named_parameters() if self.is_trainable(n)]

    def global_names(self, round: int) -> list[str]:
        """The tensors the server holds and broadcasts in ``round``."""
        return self.trainable_names()

    def client_names(self, round: int, client: int) -> list[str]:
        """The tensors client ``client`` trains and uploads in ``round``."""
        return self.trainable_names()

    def client_view(self, ctx: ClientContext, model: nn.Module, broadcast: Broadcast) -> nn.Module:
        """The module the client trains (default: the whole model)."""
        return model

    def model_tensors(self, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        """The broadcast tensors that are model parameters (subclasses may add others)."""
        return dict(broadcast.tensors)

    def check(self) -> None:
        meta = self.meta_model()
        if self.needs_vit and not isinstance(meta, VisionTransformer):
            raise ConfigError(f"{self.name} needs a ViT model, got {type(meta).__name__}")
        if not self.trainable_names():
            raise ConfigError(f"{self.name}: no trainable parameter in {self.run.model.name}")

    # --- protocol --------------------------------------------------------------
    def init_state(self) -> StateDict:
        model = self.build_model()
        gen = torch.Generator().manual_seed(derive_seed(self.run.seed, self.name, "adapters"))
        self.reset_adapters(model, gen)
        sd = model.state_dict()
        return {k: sd[k].detach().clone() for k in self.global_names(0)}

    def with_defaults(self, state: Mapping[str, torch.Tensor], names: Sequence[str]) -> StateDict:
        """``state`` plus the base value of each name in ``names`` it lacks."""
        out = dict(state)
        missing = [n for n in names if n not in out]
        if missing:
            base = self.base.state()
            out.update({n: base[n].clone() for n in missing})
        return out

    def broadcast(self, state: StateDict, round: int) -> Broadcast:
        return Broadcast(tensors=self.with_defaults(state, self.global_names(round)))

    def load_global(self, model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy global tensors into ``model`` by name (every name must exist)."""
        own = dict(model.named_parameters())
        unknown = sorted(set(tensors) - set(own))
        if unknown:
            raise ConfigError(f"{self.name}: broadcast names unknown to the model: {unknown[:4]}")
        with torch.no_grad():
            for k, v in tensors.items():
                own[k].copy_(v)

    def train_client_model(
        self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet
    ) -> nn.Module:
        """The client's model after its local training: the frozen base with the
        broadcast global tensors, only :meth:`client_names` trained."""
        model = self.build_model()
        self.load_global(model, self.model_tensors(broadcast))
        chosen = set(self.client_names(ctx.round, ctx.client_id))
        for n, p in model.named_parameters():
            p.requires_grad_(n in chosen)
        view = self.client_view(ctx, model, broadcast)
        device = self.run.device
        dropout = torch.Generator(device=device).manual_seed(ctx.seed_for(self.name, "dropout"))
        set_dropout_generator(view, dropout)
        train_local(
            view,
            data,
            self.run.train,
            transform=self.run.train_transform,
            device=device,
            generator=ctx.generator,
            progress=self.run.progress,
            description=f"client {ctx.client_id}: {self.name} local training",
        )
        return model

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        model = self.train_client_model(ctx, broadcast, data)
        params = dict(model.named_parameters())
        names = self.client_names(ctx.round, ctx.client_id)
        tensors = {n: params[n].detach().to("cpu").clone() for n in names}
        return Upload(tensors=tensors, meta={"num_samples": len(data)})

    def upload_spec(self, state: StateDict, round: int, client: int) -> UploadSpec:
        """Exactly the client's trainable tensors (names, shapes, dtypes) + ``num_samples``."""
        params = dict(self.meta_model().named_parameters())
        return UploadSpec(
            tensors={
                n: TensorSpec(tuple(params[n].shape), params[n].dtype)
                for n in self.client_names(round, client)
            },
            meta={"num_samples": NUM_SAMPLES},
        )

    def aggregate(self, state: StateDict, uploads: Mapping[int, Upload], round: int) -> StateDict:
        counts = sample_counts(uploads)
        clients = sorted(counts)
        w = WEIGHTINGS.get(self.config.weighting)([counts[c] for c in clients])
        averaged = holder_average(
            {c: uploads[c].tensors for c in clients}, dict(zip(clients, w, strict=True))
        )
        return {**state, **averaged}

    def aggregate_mean(self, state: StateDict, mean: Upload, round: int) -> StateDict:
        """The round's mean replaces the global tensors the clients trained."""
        return {**state, **mean.tensors}

    def global_model(self, state: Mapping[str, torch.Tensor]) -> nn.Module:
        """The base with the global tensors of ``state`` loaded (eval mode)."""
        model = self.build_model()
        self.load_global(model, state)
        return model.eval()

    def predictor(self, state: StateDict) -> Predictor:
        return ModelPredictor(self.global_model(state))

    # --- per-round cost figures ---------------------------------------------------
    def client_costs(self, round: int = 0, client: int = 0) -> dict[str, Any]:
        """Trainable parameters and forward GFLOPs per image of one client's training model."""
        model = self.build_model()
        chosen = set(self.client_names(round, client))
        for n, p in model.named_parameters():
            p.requires_grad_(n in chosen)
        ctx = ClientContext(self.run, client, round, torch.Generator().manual_seed(0))
        view = self.client_view(ctx, model, self.broadcast(self.init_state(), round)).eval()
        x = torch.zeros(2, *self.run.image_shape)
        return {
            "trainable_parameters": trainable_parameters(view),
            "forward_gflops_per_image": forward_gflops(view, x),
        }

    def report(self, state: StateDict) -> dict[str, Any]:
        """The client's trainable parameters and training-forward GFLOPs per image."""
        return {"client": self.client_costs()}


def bool_matrix(rows: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """Rows of column indices -> a (len(rows), width) 0/1 uint8 matrix."""
    out = np.zeros((len(rows), width), dtype=np.uint8)
    for i, cols in enumerate(rows):
        out[i, list(cols)] = 1
    return out
