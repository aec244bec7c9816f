"""FuseFL: progressive model fusion in K block-wise exchanges.

Tang et al., "FuseFL: One-Shot Federated Learning through the Lens of
Causality with Progressive Model Fusion" (NeurIPS 2024), public code
``wizard1203/FuseFL`` (``alg_train.fed_expandable``, ``models/fl_exnn.py``).
Locally trained models fit spurious features of their own skewed data (the
paper's "isolation problem"); training each block on top of *every* client's
earlier features augments them and so breaks that fit.

The model is cut into K blocks + classifier (:mod:`.split`). Step k = 0..K-1
is round k here:

- round 0: every client trains its whole model from the common initial
  weights (the shared, cached local step of FedAvg and Ensemble) and uploads
  block 0;
- round k >= 1: the server sends every client fused block k-1 (all accepted
  clients' block k-1 with their adaptors); each client puts it behind the
  fused blocks it already holds (its own :class:`ClientState`), freezes them,
  adds a new adaptor (1×1 conv: M·C concatenated channels -> C), and trains
  adaptor + its own blocks k..K-1 + classifier; it uploads adaptor + block k
  (in the last round, + its classifier);
- the fused model (:mod:`.modules`) is the K fused blocks and the clients'
  classifiers combined (``classifier``: averaged, the code's default, or each
  on its own stream).

The record counts K rounds and the bytes of each: each client uploads one
model's worth in all (+ the adaptors), the paper's "no additional
communication"; but the K uploads are sequential, and round k also sends
every client the M clients' block k-1, so FuseFL is not strictly one-shot
(docs/methods/fusefl.md).

Paper vs code vs here. The paper's body was not reachable from this machine
(its abstract and Fig. 4 were); where it is silent this follows the code:
the client's blocks after block k keep training from step to step (they are
its "temporary head", never uploaded before their step), adaptors use
PyTorch's default init, each step trains ``train`` epochs with the run's
optimiser (the code: SGD momentum 0.9, the same ``local_ep`` each step). The
code then re-trains the averaged classifier on virtual features sampled from
per-class Gaussians of every client's fused features (CCVR, ``locals/ccvr.py``):
an extra exchange of class means and covariances that is not part of the
method as the paper describes it; left out. The code's ``avg`` classifier
applies the averaged classifier to the *sum* of the members' features; here
the mean (the scale each classifier was trained at).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, UploadError
from osfl.fl.client_training import train_client
from osfl.fl.context import ClientContext, SharedTraining
from osfl.fl.method import (
    KeepsClientState,
    Method,
    MethodCard,
    MultiRound,
    Predictor,
    Reporting,
    SharedTrainingStep,
    register_method,
)
from osfl.fl.upload import (
    NUM_SAMPLES,
    Broadcast,
    TensorSpec,
    Upload,
    UploadSpec,
    spec_from_state_dict,
)
from osfl.methods.clients import (
    cpu_state,
    initial_state,
    model_from_state,
    sample_counts,
    trained_client,
)
from osfl.methods.fusefl.modules import (
    ADAPTORS,
    ClassifierFusion,
    FusedBlock,
    FusedTrunk,
    FuseFLPredictor,
    StepModel,
)
from osfl.methods.fusefl.split import ModelSplit, block_module, max_blocks, split_model

__all__ = ["FuseFL", "FuseFLConfig"]

CLASSIFIERS = ("average", "heads")
ADAPTOR, BLOCK, HEAD, OWN, FUSED = "adaptor.", "block.", "head.", "own.", "fused."
StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FuseFLConfig:
    """``blocks``: K, the number of blocks = rounds (2 .. the model's maximum:
    3 for ``cnn_small``, 5 for the ResNets; the code's default is 2);
    ``adaptor``: ``conv1x1`` (paper Fig. 4, the code's scripts) or ``avg``
    (parameter-free mean); ``classifier``: ``average`` (the code's default) or
    ``heads``. Every step trains with the run's recipe, so round 0 is the
    cached local training that Ensemble and FedAvg share
    (``method_train.fusefl.epochs``: local epochs of each step; the code's
    scripts split one local budget over the K steps, e.g. 200 -> 4 × 50)."""

    #: K, the blocks the model is cut into = rounds (2..3 for cnn_small, 2..5 for the ResNets)
    blocks: int = 2
    #: how a block reads every client's earlier features: conv1x1 or avg (parameter-free mean)
    adaptor: str = "conv1x1"
    #: final classifier: average (one averaged head) or heads (each client's, logits averaged)
    classifier: str = "average"

    def __post_init__(self) -> None:
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 2:
            raise ConfigError(
                f"method.fusefl: blocks must be an integer >= 2 (K rounds), got {self.blocks!r}"
            )
        if self.adaptor not in ADAPTORS:
            raise ConfigError(
                f"method.fusefl: adaptor must be one of {ADAPTORS.names()}, got {self.adaptor!r}"
            )
        if self.classifier not in CLASSIFIERS:
            raise ConfigError(
                f"method.fusefl: classifier must be one of {CLASSIFIERS}, got {self.classifier!r}"
            )


def _sub(tensors: Mapping[str, torch.Tensor], prefix: str) -> StateDict:
    """The tensors under ``prefix``, with it stripped."""
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}


def _with(prefix: str, tensors: Mapping[str, torch.Tensor]) -> StateDict:
    return {prefix + k: v for k, v in tensors.items()}


class NoModelYet(Predictor):
    """Zero scores for every class: what the server can predict before the
    last round delivers the classifiers (``eval_every`` curve points)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape[0], self.num_classes)


@register_method("fusefl")
class FuseFL(Method, MultiRound, KeepsClientState, SharedTrainingStep, Reporting):
    """Progressive block-wise fusion over K rounds (see the module docstring).

    Server state: ``{"init": state dict, "fused": [{client: {"adaptor": sd,
    "block": sd}}, ...] (one entry per finished round), "heads": {client: sd},
    "num_samples": {client: n}}``. A client's own state: its current model
    (``own.*``) and the fused blocks it received (``fused.<j>.<client>.*``,
    members in ``meta["members"]``)."""

    Config: ClassVar[type] = FuseFLConfig
    card: ClassVar[MethodCard] = MethodCard(
        summary=(
            "Fuses the client models block by block over K rounds, each block trained on every "
            "client's earlier blocks."
        ),
        paper=(
            'Tang et al., "FuseFL: One-Shot Federated Learning through the Lens of Causality with '
            'Progressive Model Fusion", NeurIPS 2024'
        ),
        one_shot=False,
    )

    config: FuseFLConfig

    @property
    def rounds(self) -> int:
        return self.config.blocks

    def check(self) -> None:
        name, k = self.run.model.name, self.config.blocks
        if k > max_blocks(name):  # also refuses an unsupported model, naming the supported
            raise ConfigError(
                f"method.fusefl: blocks must be between 2 and {max_blocks(name)} for model "
                f"{name!r}, got {k}"
            )

    # --- structure (public: a function of the run's model) -------------------
    @cached_property
    def split(self) -> ModelSplit:
        self.check()
        return split_model(self.run.model.name, self.run.model.build_meta(1), self.config.blocks)

    @cached_property
    def _reference(self) -> nn.Module:
        """The model at its initial weights: block shapes, channels and specs."""
        return model_from_state(self.run, self._init)

    @cached_property
    def _init(self) -> StateDict:
        return initial_state(self.run)

    @cached_property
    def channels(self) -> list[int]:
        """Output channels of each block (what its successor's adaptor maps back to)."""
        model = self._reference.eval()
        x: torch.Tensor = torch.zeros(2, *self.run.image_shape)
        out = []
        with torch.no_grad():
            for paths in self.split.blocks:
                x = block_module(model, paths)(x)
                out.append(int(x.shape[1]))
        return out

    def block_state(self, model: nn.Module, j: int) -> StateDict:
        return cpu_state(block_module(model, self.split.blocks[j]))

    def new_adaptor(self, j: int, members: int, gen: torch.Generator | None = None) -> nn.Module:
        """The adaptor in front of block ``j`` >= 1, over ``members`` streams."""
        return ADAPTORS.get(self.config.adaptor)(members, self.channels[j - 1], gen)

    def build_trunk(self, fused: list[Mapping[int, Mapping[str, StateDict]]]) -> FusedTrunk:
        """The fused blocks 0..len(fused)-1 from their members' states."""
        models: dict[int, nn.Module] = {}
        blocks = []
        prev_members = 0
        for j, entry in enumerate(fused):
            members = sorted(entry)
            mods, adaptors = [], []
            for c in members:
                if c not in models:
                    models[c] = model_from_state(self.run, self._init)
                mod = block_module(models[c], self.split.blocks[j])
                mod.load_state_dict(entry[c]["block"])
                mods.append(mod)
                if j > 0:
                    a = self.new_adaptor(j, prev_members)
                    a.load_state_dict(entry[c]["adaptor"])
                    adaptors.append(a)
            blocks.append(FusedBlock(members, mods, adaptors))
            prev_members = len(members)
        return FusedTrunk(blocks).eval()

    # --- the protocol ------------------------------------------------------------
    def init_state(self) -> dict[str, Any]:
        self.check()
        return {"init": dict(self._init), "fused": [], "heads": {}, "num_samples": {}}

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        if round == 0:
            return Broadcast(tensors=dict(state["init"]))
        entry = state["fused"][round - 1]
        tensors: StateDict = {}
        for c in sorted(entry):
            tensors.update(_with(f"{FUSED}{c}.{ADAPTOR}", entry[c]["adaptor"]))
            tensors.update(_with(f"{FUSED}{c}.{BLOCK}", entry[c]["block"]))
        return Broadcast(tensors=tensors, meta={"members": sorted(entry)})

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        if round != 0:
            return None
        return SharedTraining(model_from_state(self.run, broadcast.tensors), self.run.train)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        k = ctx.round
        if k == 0:
            model = trained_client(ctx, data, broadcast.tensors, cfg=self.run.train)
            ctx.state.tensors = _with(OWN, cpu_state(model))
            ctx.state.meta = {"members": []}
            return Upload(_with(BLOCK, self.block_state(model, 0)), {"num_samples": len(data)})
        fused = self._receive(ctx, broadcast)
        own = model_from_state(self.run, _sub(ctx.state.tensors, OWN))
        gen = torch.Generator().manual_seed(ctx.seed_for("fusefl-adaptor"))
        adaptor = self.new_adaptor(k, len(fused[-1]), gen)
        blocks = [block_module(own, p) for p in self.split.blocks[k:]]
        head = own.get_submodule(self.split.head)
        step = StepModel(self.build_trunk(fused), adaptor, blocks, head)
        # trained in place (``own`` shares the step model's blocks), through the
        # client cache: the key holds the step model's weights, fused prefix included
        train_client(ctx, data, model=step, cfg=self.run.train, extra_key=("fusefl", k))
        ctx.state.tensors = {
            **{n: v for n, v in ctx.state.tensors.items() if not n.startswith(OWN)},
            **_with(OWN, cpu_state(own)),
        }
        tensors = {**_with(ADAPTOR, cpu_state(adaptor)), **_with(BLOCK, self.block_state(own, k))}
        if k == self.rounds - 1:
            tensors.update(_with(HEAD, cpu_state(head)))
        return Upload(tensors, {"num_samples": len(data)})

    def _receive(
        self, ctx: ClientContext, broadcast: Broadcast
    ) -> list[dict[int, dict[str, StateDict]]]:
        """Adds the broadcast fused block to the ones this client holds; returns them all."""
        members = broadcast.meta.get("members")
        if not isinstance(members, list) or not members:
            raise UploadError(f"fusefl round {ctx.round}: the broadcast names no fused members")
        j = ctx.round - 1
        ctx.state.tensors.update(_with(f"{FUSED}{j}.", _sub(broadcast.tensors, FUSED)))
        held = [*ctx.state.meta.get("members", [])[:j], [int(c) for c in members]]
        ctx.state.meta = {**ctx.state.meta, "members": held}
        fused = []
        for i, ids in enumerate(held):
            block = _sub(ctx.state.tensors, f"{FUSED}{i}.")
            fused.append(
                {
                    c: {
                        "adaptor": _sub(block, f"{c}.{ADAPTOR}"),
                        "block": _sub(block, f"{c}.{BLOCK}"),
                    }
                    for c in ids
                }
            )
        return fused

    # --- uploads and aggregation ------------------------------------------------
    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        ref = self._reference
        tensors = dict(spec_from_state_dict(self.block_state(ref, round), prefix=BLOCK).tensors)
        if round > 0:
            adaptor = self.new_adaptor(round, len(state["fused"][round - 1]))
            tensors.update(
                {
                    ADAPTOR + k: TensorSpec(tuple(v.shape), v.dtype)
                    for k, v in adaptor.state_dict().items()
                }
            )
        if round == self.rounds - 1:
            head = cpu_state(ref.get_submodule(self.split.head))
            tensors.update(spec_from_state_dict(head, prefix=HEAD).tensors)
        return UploadSpec(tensors=tensors, meta={"num_samples": NUM_SAMPLES})

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        counts = sample_counts(uploads)
        clients = sorted(counts)
        entry = {
            c: {
                "adaptor": _sub(uploads[c].tensors, ADAPTOR),
                "block": _sub(uploads[c].tensors, BLOCK),
            }
            for c in clients
        }
        new = {
            **state,
            "fused": [*state["fused"], entry],
            "num_samples": {**state["num_samples"], **counts},
        }
        if round == self.rounds - 1:
            new["heads"] = {c: _sub(uploads[c].tensors, HEAD) for c in clients}
        return new

    def predictor(self, state: dict[str, Any]) -> Predictor:
        if len(state["fused"]) < self.rounds or not state["heads"]:
            # before round K the server holds no classifier (the clients' tails
            # and heads are still local): a curve point scores "no model yet"
            return NoModelYet(self.run.num_classes)
        trunk = self.build_trunk(state["fused"])
        members = trunk.blocks[-1].members
        heads = []
        for c in members:
            head = model_from_state(self.run, self._init).get_submodule(self.split.head)
            head.load_state_dict(state["heads"][c])
            heads.append(head)
        n = [state["num_samples"][c] for c in members]
        weights = [x / sum(n) for x in n]
        return FuseFLPredictor(trunk, ClassifierFusion(heads, weights, self.config.classifier))

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """The fused model's size against one client model (inference grows with M)."""
        single = sum(v.numel() for v in state["init"].values() if v.is_floating_point())
        parts = [sd for entry in state["fused"] for m in entry.values() for sd in m.values()]
        parts += list(state["heads"].values())
        fused = sum(v.numel() for sd in parts for v in sd.values() if v.is_floating_point())
        return {
            "blocks": self.config.blocks,
            "members_per_block": [len(e) for e in state["fused"]],
            "fused_parameters": int(fused),
            "client_model_parameters": int(single),
        }
