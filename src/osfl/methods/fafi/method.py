"""FAFI as an osfl :class:`~osfl.fl.method.Method` (one-shot): the protocol.

Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025 (Algorithm 1):

1. the server broadcasts the common initial weights (backbone, projection,
   prototypes) of every client architecture in use (:mod:`.architectures`);
2. each client runs SALT (Eq. 4–6, :class:`~osfl.methods.fafi.salt.SaltLoss`)
   through the shared client-training cache under its own objective key, and
   uploads its extractor and its C×D prototypes — nothing else (:mod:`.local`;
   osfl's robust ``fusion="median"``, not in the paper, also needs each
   client's per-class sample counts, ``meta.class_counts``);
3. the server averages the prototypes and predicts with IFFI (Eq. 8–10,
   :mod:`.inference`).

Ablations (paper Tables 3, 4, 9) are options of
:class:`~osfl.methods.fafi.config.FAFIConfig`: the loss weights switch SALT's
terms (``loss: {ssl_weight: 0, proto_weight: 0, ce_weight: 1}`` is the
plain-CE client, which then *is* the FedAvg/Ensemble client and shares their
cache entries), ``prototypes`` picks learned prototypes, the CE head's rows or
per-class feature means, and ``fusion`` picks IFFI, the plain feature average,
or parameter averaging of the extractors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.fl.context import ClientContext
from osfl.fl.method import Method, MethodCard, Predictor, Screening, register_method
from osfl.fl.upload import (
    NUM_SAMPLES,
    Broadcast,
    MetaSpec,
    TensorSpec,
    Upload,
    UploadSpec,
    spec_from_state_dict,
)
from osfl.methods.clients import member_problem, public_fl_hparams, sample_counts
from osfl.methods.fafi.architectures import Architectures
from osfl.methods.fafi.config import FAFICodeConfig, FAFIConfig
from osfl.methods.fafi.fusion import warn_unprotected
from osfl.methods.fafi.inference import (
    class_counts_of,
    client_extractor,
    fafi_predictor,
    server_prototypes,
)
from osfl.methods.fafi.local import client_prototypes, train_net

_EXT = "extractor."


@register_method("fafi")
class FAFI(Method, Screening):
    """Server state: ``{"init": {arch: FAFINet state}, "clients": {id: {...}}}``."""

    card: ClassVar[MethodCard] = MethodCard(
        summary=(
            "Clients learn self-aligned features and class prototypes; the server classifies with "
            "their fused features."
        ),
        paper=(
            'Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model Inconsistency in '
            'One-shot Federated Learning", ICML 2025'
        ),
        uploads="weights+prototypes",
        default_run=True,
        default_order=20,
        smoke=("method.fafi.augment=flip",),
    )

    Config: ClassVar[type] = FAFIConfig

    def __init__(self, config: FAFIConfig, run: Any):
        super().__init__(config, run)
        self._specs: dict[str, dict[str, TensorSpec]] = {}

    @cached_property
    def arches(self) -> Architectures:
        return Architectures(self.run, self.config)

    @property
    def counts_classes(self) -> bool:
        """Whether clients send ``meta.class_counts``: only the median fusion
        reads them (who holds a class), and they reveal a client's label mix,
        so the paper's protocol (extractor + prototypes) sends none."""
        return self.config.fusion == "median"

    def arch_of(self, client: int) -> str:
        """Client ``client``'s model name (``models`` cycled, or the run's model)."""
        return self.arches.of(client)

    # --- protocol --------------------------------------------------------
    def init_state(self) -> dict[str, Any]:
        init = {}
        for arch in self.arches.names():
            net = self.arches.initial(arch)
            init[arch] = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return {"init": init, "clients": {}}

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        tensors = {f"{arch}/{k}": v for arch, sd in state["init"].items() for k, v in sd.items()}
        return Broadcast(tensors=tensors)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        arch = self.arch_of(ctx.client_id)
        prefix = f"{arch}/"
        init = {k[len(prefix) :]: v for k, v in broadcast.tensors.items() if k.startswith(prefix)}
        net = self.arches.build(arch)
        net.load_state_dict(init, strict=True)
        net = train_net(self.arches, ctx, net, data, arch)
        tensors = {_EXT + k: v for k, v in net.extractor().state_dict().items()}
        tensors["prototypes"] = client_prototypes(self.arches, net, data, ctx.device)
        meta: dict[str, Any] = {"num_samples": len(data)}
        if self.counts_classes:
            counts = torch.bincount(data.labels.cpu(), minlength=self.run.num_classes)
            meta["class_counts"] = [int(n) for n in counts]
        return Upload(tensors=tensors, meta=meta)

    # --- validation ------------------------------------------------------
    def _extractor_spec(self, state: dict[str, Any], arch: str) -> dict[str, TensorSpec]:
        if arch not in self._specs:  # BatchNorm variances >= 0, every float finite
            extractor = self._initial_extractor(state, arch).state_dict()
            self._specs[arch] = spec_from_state_dict(extractor, prefix=_EXT).tensors
        return self._specs[arch]

    def _initial_extractor(self, state: dict[str, Any], arch: str) -> nn.Module:
        net = self.arches.build(arch)
        net.load_state_dict(state["init"][arch])
        return net.extractor()

    def _proto_spec(self, state: dict[str, Any]) -> TensorSpec:
        d = next(iter(state["init"].values()))["prototypes"].shape[1]
        return TensorSpec((self.run.num_classes, d), torch.float32)

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        """Exactly client ``client``'s extractor keys/shapes (its own architecture)
        + its C×D prototypes + ``num_samples``; with ``fusion="median"`` also
        ``class_counts`` (C non-negative integers summing to ``num_samples``:
        the classes it trained on, which the median counts as holders)."""
        tensors = {**self._extractor_spec(state, self.arch_of(client))}
        tensors["prototypes"] = self._proto_spec(state)
        meta: dict[str, MetaSpec] = {"num_samples": NUM_SAMPLES}
        if self.counts_classes:
            c = self.run.num_classes
            meta["class_counts"] = MetaSpec("int_list", low=0, length=c, sum_of="num_samples")
        return UploadSpec(tensors=tensors, meta=meta)

    def screen(self, state: dict[str, Any], round: int, client: int, upload: Upload) -> str | None:
        """``server.member_filter``: an extractor whose features on the
        server's probe batch are not finite, or prototypes whose norms
        overflow (valid-looking poisons that break every fused score), are
        refused; ``finite_norm`` also bounds the
        extractor's update (``server.max_update_norm``)."""
        if self.run.server.member_filter == "none":
            return None
        arch = self.arch_of(client)
        norms = upload.tensors["prototypes"].float().norm(dim=1)  # as the fusion computes them
        if not bool(torch.isfinite(norms).all()):
            return "prototype norms overflow float32: the fused scores would not be finite"

        def load(extractor: Mapping[str, torch.Tensor]) -> nn.Module:
            module = self.arches.build(arch).extractor()
            module.load_state_dict(dict(extractor), strict=True)
            return module

        tensors = {k[len(_EXT) :]: v for k, v in upload.tensors.items() if k.startswith(_EXT)}
        init = self._initial_extractor(state, arch).state_dict()
        return member_problem(self.run, tensors, init, build=load)

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        clients = dict(state["clients"])
        for c, n in sorted(sample_counts(uploads).items()):
            up = uploads[c]
            clients[c] = {
                "extractor": {
                    k[len(_EXT) :]: v for k, v in up.tensors.items() if k.startswith(_EXT)
                },
                "prototypes": up.tensors["prototypes"],
                "num_samples": n,
            }
            if self.counts_classes:
                clients[c]["class_counts"] = list(up.meta["class_counts"])
        if self.counts_classes:  # in the round's server warnings, so in the record
            warn_unprotected(class_counts_of(clients))
        return {"init": state["init"], "clients": clients}

    # --- inference -------------------------------------------------------
    def global_prototypes(self, state: dict[str, Any]) -> torch.Tensor:
        return server_prototypes(self.config, state["clients"])

    def extractor_of(self, state: dict[str, Any], client: int) -> nn.Module:
        return client_extractor(self.arches, state, client)

    def predictor(self, state: dict[str, Any]) -> Predictor:
        return fafi_predictor(self.arches, state)

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp


@register_method("fafi_code")
class FAFICode(FAFI):
    """FAFI with the public code's recipe as defaults (docs/design.md §8: the code
    variant kept where it matters for published numbers): its loss and
    inference (:class:`~osfl.methods.fafi.config.FAFICodeConfig`), and its
    gradient-norm clipping at 1 as a local-training default."""

    Config: ClassVar[type] = FAFICodeConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        FAFI.card,
        summary=(
            "FAFI with the defaults of its public code where they differ from the paper (loss, "
            "fusion, clipping)."
        ),
        paper="Zeng et al., ICML 2025 (FAFI), public code github.com/zenghui9977/FAFI_ICML25",
        default_run=False,
        default_order=21,
        smoke=("method.fafi_code.augment=flip",),
        train_defaults={"grad_clip": 1.0},
    )
