"""EFTViT as an osfl :class:`~osfl.fl.method.Method` (multi-round).

"EFTViT: Efficient Federated Training of Vision Transformers with Masked
Images on Resource-Constrained Clients" (no public code),
§3 and §4.2. Each round:

1. the server broadcasts the **global module** (blocks M..L-1, final norm)
   and its head (``broadcast_head``, see below);
2. each sampled client loads them into its ViT, whose **local module**
   (patch embedding, class and position embeddings, blocks 0..M-1) is its
   own: kept in its client state (``ctx.state``) from round to round, the
   pretrained one in its first round — local modules are never uploaded or
   averaged; it trains the local module and the head on masked images (a
   fresh random ratio-r mask per image and step, §3.3; the global module
   frozen, Eq. 1–2) and records the local module's output tokens;
3. median sampling (§3.4, :mod:`.sampling`) turns those tokens into a
   class-balanced set, which is the upload (:mod:`.upload`);
4. the server trains the global module and its head on the round's uploads
   (Eq. 3–4, :mod:`.server`).

Inference uses whole images, "on each client" (§3.3): a client's own model
is its local module under the broadcast global module and head
(:meth:`EFTViT.client_predictor`, the :class:`~osfl.fl.method.OwnModels`
capability), and their mean is the record's ``mean_client_accuracy`` (a
client never sampled has the pretrained local module). The
server's predictor, which the paper never deploys, is its global module and
head on top of the **pretrained local module** (the paper never uploads a
client's local module, so the server has no other); the record keeps its
accuracy beside the clients' (``global_test_accuracy``).

The head: the paper trains "the global module and classification head" on
the server and sends back "the global module parameters". We broadcast the
server's head with the global module by default: the server trains the two
jointly, a client head left over from an earlier round was fitted to an
older global module, and the head is tiny (D·K numbers). The client still
trains a head copy locally (Eq. 2) to shape its local module's gradients,
and discards it. ``broadcast_head=false`` keeps a private head per client in
its state instead (the literal reading).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.method import (
    KeepsClientState,
    Method,
    MethodCard,
    MultiRound,
    OwnModels,
    Predictor,
    Reporting,
    Screening,
    SiteEvaluation,
    register_method,
    sample_fraction,
)
from osfl.fl.seeds import derive_seed
from osfl.fl.state_codec import state_type
from osfl.fl.training import train_local
from osfl.fl.upload import Broadcast, Upload, UploadSpec
from osfl.methods.clients import ModelPredictor, StateDict, public_fl_hparams
from osfl.methods.eftvit.client import (
    EFTViTNet,
    MaskedTraining,
    head_names,
    local_names,
    num_kept,
)
from osfl.methods.eftvit.sampling import median_sample
from osfl.methods.eftvit.server import ServerTrainConfig, train_global_module
from osfl.methods.eftvit.upload import (
    feature_upload_spec,
    has_features,
    missing_classes,
    pack_features,
    server_histogram,
    unpack_features,
)
from osfl.methods.peft.base import FrozenBase
from osfl.methods.peft.flops import forward_gflops, trainable_parameters
from osfl.models.vit import VisionTransformer


@dataclass(frozen=True)
class EFTViTConfig:
    """EFTViT's options; defaults from §4.2 and §4.4 (see docs/methods/eftvit.md).

    ``mask_ratio`` r = 0.75 and ``local_depth`` M = 2 (§4.4); ``rounds`` 100
    and 100 clients with a sampled ``client_fraction`` (0.1: our choice, the
    value is lost from our copy); ``threshold_quantile`` 0.5 = the median
    (Fig. 7 tries higher); ``pad``: pad minority classes still below the
    threshold by resampling (:mod:`.sampling`); ``server``: the server's
    training recipe (the clients' is the run's: ``train.*``, or
    ``method_train.eftvit.*`` for EFTViT alone).
    """

    #: communication rounds
    rounds: int = 100
    #: share of the clients sampled each round
    client_fraction: float = 0.1
    #: share of each image's patches a client masks out while training its local module
    mask_ratio: float = 0.75
    #: ViT blocks in each client's private local module (the rest is the shared global module)
    local_depth: int = 2
    #: quantile of the per-class feature counts that the server's class-balanced sampling targets
    #: (0.5: the median)
    threshold_quantile: float = 0.5
    #: pad the classes still below that target by resampling their features
    pad: bool = True
    #: send the server's classifier head to the clients with the global module
    broadcast_head: bool = True
    #: the server's training recipe for the global module
    server: ServerTrainConfig = field(default_factory=ServerTrainConfig)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"method.eftvit: {msg}")

        need(self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")
        need(
            0.0 < self.client_fraction <= 1.0,
            f"client_fraction must lie in (0, 1], got {self.client_fraction}",
        )
        need(0.0 <= self.mask_ratio < 1.0, f"mask_ratio must lie in [0, 1), got {self.mask_ratio}")
        need(self.local_depth >= 1, f"local_depth must be >= 1, got {self.local_depth}")
        need(
            0.0 <= self.threshold_quantile <= 1.0,
            f"threshold_quantile must lie in [0, 1], got {self.threshold_quantile}",
        )


@state_type
@dataclass
class EFTViTState:
    """Server state: the global module and head (``global_module``, full-model
    names) and one record per round of what was uploaded and trained."""

    global_module: StateDict
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors (``global_module.*``) for checkpoints."""
        return {f"global_module.{k}": v for k, v in self.global_module.items()}


@dataclass(frozen=True)
class ParameterRoles:
    """``local``: the local module; ``head``; ``server``: what the server trains
    (global module + head); ``sent``: what it broadcasts; ``kept``: what each
    client keeps in its state."""

    local: list[str]
    head: list[str]
    server: list[str]
    sent: list[str]
    kept: list[str]


def empty_round(round: int) -> dict[str, Any]:
    """The record of a round whose uploads held no feature (nothing trained)."""
    return {
        "round": round,
        "features": 0,
        "per_class": [],
        "per_client": {},
        "server": {"steps": 0, "samples": 0, "mean_loss": None},
    }


@register_method("eftvit")
class EFTViT(Method, MultiRound, KeepsClientState, OwnModels, Screening, SiteEvaluation, Reporting):
    """Hierarchical FL of a ViT: private masked-trained local modules, a global
    module trained on the server from median-sampled patch features; each
    client's own model is what the record scores (``OwnModels``)."""

    card: ClassVar[MethodCard] = MethodCard(
        summary=(
            "Clients train private front blocks of a ViT on masked images; the server trains the "
            "shared back blocks."
        ),
        paper=(
            '"EFTViT: Efficient Federated Training of Vision Transformers with Masked Images on '
            'Resource-Constrained Clients"'
        ),
        regime="pretrained",
        uploads="features",
        one_shot=False,
        default_order=50,
        smoke=(
            "model.name=vit_tiny_patch2_16",
            "model.kwargs={patch_size: 4, depth: 2, embed_dim: 64, num_heads: 2}",
            "train.optimizer=adamw",
            "train.lr=0.0001",
            "train.epochs=2",
            "method.eftvit.rounds=2",
            "method.eftvit.client_fraction=1.0",
            "method.eftvit.local_depth=1",
            "method.eftvit.mask_ratio=0.5",
            "method.eftvit.server.lr=0.01",
            "method.eftvit.server.epochs=3",
            "method.eftvit.server.batch_size=16",
        ),
    )

    Config: ClassVar[type] = EFTViTConfig

    def __init__(self, config: EFTViTConfig, run: Any):
        super().__init__(config, run)
        self.base = FrozenBase(run)
        self._roles: ParameterRoles | None = None

    # --- structure ---------------------------------------------------------------
    def names(self) -> ParameterRoles:
        """Which parameter does what (full-model names), from the architecture."""
        if self._roles is None:
            vit = self.base_vit()
            local = local_names(vit, self.config.local_depth)  # type: ignore[arg-type]
            head = head_names(vit)  # type: ignore[arg-type]
            server = [n for n, _ in vit.named_parameters() if n not in set(local)]
            sent = server if self.config.broadcast_head else [n for n in server if n not in head]
            kept = local if self.config.broadcast_head else [*local, *head]
            self._roles = ParameterRoles(local, head, server, sent, kept)
        return self._roles

    def base_vit(self) -> VisionTransformer:
        """The run's base ViT (read-only; for names and shapes)."""
        vit = self.base.template()
        if not isinstance(vit, VisionTransformer):
            raise ConfigError(f"eftvit needs a ViT model, got {type(vit).__name__}")
        return vit

    def num_keep(self) -> int:
        return num_kept(self.base_vit().num_patches, self.config.mask_ratio)

    def tokens_per_feature(self) -> int:
        return self.base_vit().num_prefix_tokens + self.num_keep()

    @property
    def rounds(self) -> int:
        return self.config.rounds

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        return sample_fraction(self.config.client_fraction, round, num_clients, rng)

    def check(self) -> None:
        vit = self.base_vit()
        depth = len(vit.blocks)
        if not 1 <= self.config.local_depth < depth:
            raise ConfigError(
                f"method.eftvit.local_depth={self.config.local_depth} must lie in [1, {depth - 1}] "
                f"for a {depth}-block ViT (the global module needs at least one block)"
            )
        if self.num_keep() < 1:
            raise ConfigError(
                f"method.eftvit.mask_ratio={self.config.mask_ratio} keeps no patch of "
                f"{vit.num_patches}; lower it"
            )
        if self.run.train.steps is not None:
            raise ConfigError(
                "eftvit counts local epochs (median sampling keeps minority classes' features "
                "of every epoch, the others' of the last): set train.epochs, not train.steps"
            )

    # --- protocol ----------------------------------------------------------------
    def init_state(self) -> EFTViTState:
        base = self.base.state()
        return EFTViTState({n: base[n].clone() for n in self.names().server})

    def broadcast(self, state: EFTViTState, round: int) -> Broadcast:
        return Broadcast(tensors={n: state.global_module[n] for n in self.names().sent})

    def client_net(self, global_tensors: Mapping[str, torch.Tensor], own: ClientState) -> EFTViTNet:
        """The client's ViT: base weights, the broadcast global module, its own
        local module (and head) from its state when it has one."""
        vit = self.base.build()
        params = dict(vit.named_parameters())
        roles = self.names()
        with torch.no_grad():
            for n in roles.sent:
                params[n].copy_(global_tensors[n])
            if own.tensors:
                missing = sorted(set(roles.kept) - set(own.tensors))
                if missing:
                    raise ConfigError(f"eftvit: client state lacks {missing[:3]}")
                for n in roles.kept:
                    params[n].copy_(own.tensors[n])
        return EFTViTNet(vit, self.config.local_depth)  # type: ignore[arg-type]

    def train_local_module(
        self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet
    ) -> tuple[EFTViTNet, MaskedTraining]:
        """One client's masked local training (§3.3, Eq. 1–2): the trained
        network and the recorded per-step patch features."""
        net = self.client_net(broadcast.tensors, ctx.state)
        roles = self.names()
        trainable = set(roles.local) | set(roles.head)
        for n, p in net.vit.named_parameters():
            p.requires_grad_(n in trainable)
        masked = MaskedTraining(
            self.num_keep(), torch.Generator().manual_seed(ctx.seed_for("eftvit-mask"))
        )
        train_local(
            net,
            data,
            self.run.train,
            transform=self.run.train_transform,
            device=self.run.device,
            generator=ctx.generator,
            loss_fn=masked,
            progress=self.run.progress,
            description=f"client {ctx.client_id}: eftvit masked local training",
        )
        return net, masked

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        net, masked = self.train_local_module(ctx, broadcast, data)
        cfg = self.run.train
        per_epoch = cfg.batches_per_epoch(len(data))
        epochs = [i // per_epoch for i in range(len(masked.tokens))]
        per_class, plan = median_sample(
            masked.tokens,
            masked.labels,
            epochs,
            data.class_counts(),
            num_epochs=cfg.epochs,
            quantile=self.config.threshold_quantile,
            pad=self.config.pad,
            generator=torch.Generator().manual_seed(ctx.seed_for("eftvit-sampling")),
        )
        params = dict(net.vit.named_parameters())
        ctx.state.tensors = {n: params[n].detach().to("cpu").clone() for n in self.names().kept}
        uploaded = [
            int(per_class[c].shape[0]) if c in per_class else 0 for c in range(len(plan.counts))
        ]
        record = {
            "round": ctx.round,
            "threshold": plan.threshold,
            "class_counts": list(plan.counts),
            "generated": list(plan.available),
            "uploaded": uploaded,
        }
        ctx.state.meta = {"sampling": [*ctx.state.meta.get("sampling", []), record]}
        return pack_features(per_class, self.run.num_classes, plan.threshold)

    def upload_spec(self, state: EFTViTState, round: int, client: int) -> UploadSpec:
        vit = self.base_vit()
        return feature_upload_spec(
            self.run.num_classes, self.tokens_per_feature(), vit.embed_dim, self.config.pad
        )

    def screen(self, state: EFTViTState, round: int, client: int, upload: Upload) -> str | None:
        missing = missing_classes(upload)
        if missing:
            return f"meta.counts declares class {missing[0]} but features.{missing[0]} is absent"
        return None

    def aggregate(
        self, state: EFTViTState, uploads: Mapping[int, Upload], round: int
    ) -> EFTViTState:
        clients = [c for c in sorted(uploads) if has_features(uploads[c].tensors)]
        if not clients:
            return EFTViTState(dict(state.global_module), [*state.history, empty_round(round)])
        parts = [unpack_features(uploads[c].tensors) for c in clients]
        features = torch.cat([f for f, _ in parts])
        labels = torch.cat([y for _, y in parts])
        vit = self.base.build()
        params = dict(vit.named_parameters())
        with torch.no_grad():
            for n, v in state.global_module.items():
                params[n].copy_(v)
        _, top = vit.split(self.config.local_depth)  # type: ignore[attr-defined]
        stats = train_global_module(
            top,
            features,
            labels,
            self.config.server,
            device=self.run.device,
            generator=torch.Generator().manual_seed(
                derive_seed(self.run.seed, "eftvit-server", round)
            ),
            progress=self.run.progress,
        )
        trained = {n: params[n].detach().to("cpu").clone() for n in state.global_module}
        per_client = {
            str(c): server_histogram(uploads[c].tensors, self.run.num_classes).tolist()
            for c in clients
        }
        record = {
            "round": round,
            "features": len(labels),
            "per_class": np.bincount(labels.numpy(), minlength=self.run.num_classes).tolist(),
            "per_client": per_client,
            "server": stats,
        }
        return EFTViTState(trained, [*state.history, record])

    # --- inference ---------------------------------------------------------------
    def global_model(self, state: EFTViTState) -> nn.Module:
        """The server's predictor: the pretrained local module + the trained
        global module and head."""
        vit = self.base.build()
        params = dict(vit.named_parameters())
        with torch.no_grad():
            for n, v in state.global_module.items():
                params[n].copy_(v)
        return vit.eval()

    def predictor(self, state: EFTViTState) -> Predictor:
        return ModelPredictor(self.global_model(state))

    def release(self, state: EFTViTState) -> EFTViTState:
        """The global module only, not the per-client upload histograms."""
        return EFTViTState(state.global_module)

    def client_predictor(self, broadcast: Broadcast, client_state: ClientState) -> Predictor:
        """Client inference (§3.3, whole images): the broadcast global module
        (and head, with ``broadcast_head``) under the client's own local
        module (and private head) from its state; a client never sampled has
        the pretrained ones (with ``broadcast_head`` its model is then the
        server's predictor)."""
        net = self.client_net(broadcast.tensors, client_state)
        return ModelPredictor(net.vit.eval())

    # --- reporting ---------------------------------------------------------------
    def client_costs(self) -> dict[str, Any]:
        """Trainable parameters and forward GFLOPs per image of a client's
        training forward (masked) and of the unmasked forward (Table 3–5)."""
        net = self.client_net(self.base.state(), ClientState())
        roles = self.names()
        trainable = set(roles.local) | set(roles.head)
        for n, p in net.vit.named_parameters():
            p.requires_grad_(n in trainable)
        x = torch.zeros(2, *self.run.image_shape)
        keep = torch.arange(self.num_keep()).expand(2, -1)
        return {
            "trainable_parameters": trainable_parameters(net),
            "forward_gflops_per_image": forward_gflops(lambda t: net(t, keep), x),
            "forward_gflops_per_image_unmasked": forward_gflops(net, x),
            "patches_kept": self.num_keep(),
            "patches": net.num_patches,
        }

    def report(self, state: EFTViTState) -> dict[str, Any]:
        """Client costs, the server's trainable parameters, and per round the
        uploaded feature vectors (total, per class, per client) and the server's
        training (steps, loss). What a client *generated* before sampling is
        client-private: it is in each client's state (``meta.sampling``)."""
        return {
            "client": self.client_costs(),
            "server": {
                "trainable_parameters": sum(v.numel() for v in state.global_module.values())
            },
            "uploads": [
                {k: r[k] for k in ("round", "features", "per_class", "per_client")}
                for r in state.history
            ],
            "server_training": [{"round": r["round"], **r["server"]} for r in state.history],
        }

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp
