"""FAFI as an osfl :class:`~osfl.fl.method.Method` (one-shot).

Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025 (Algorithm 1):

1. the server broadcasts the common initial weights (backbone, projection,
   prototypes) of every client architecture in use;
2. each client runs SALT (Eq. 4–6, :class:`~osfl.methods.fafi.client.SaltLoss`)
   through the shared client-training cache under its own objective key, and
   uploads its extractor and its C×D prototypes — nothing else;
3. the server averages the prototypes and predicts with IFFI (Eq. 8–10,
   :class:`~osfl.methods.fafi.fusion.IFFIPredictor`).

Ablations (paper Tables 3, 4, 9) are options of :class:`FAFIConfig`: the loss
weights switch SALT's terms (``ssl_weight=0, proto_weight=0, ce_weight=1`` is
the plain-CE client, which then *is* the FedAvg/Ensemble client and shares
their cache entries), ``prototypes`` picks learned prototypes, the CE head's
rows or per-class feature means, and ``fusion`` picks IFFI, the plain feature
average, or parameter averaging of the extractors. ``models`` gives each
client its own architecture (Table 8); ``feature_dim`` adds a projection so
that they all end in the same feature dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import (
    PIPELINES,
    Compose,
    Normalize,
    Transform,
    build_transform,
    simclr_pipeline,
)
from osfl.errors import ConfigError
from osfl.fl.client_training import train_client
from osfl.fl.context import ClientContext, ModelSpec
from osfl.fl.method import Method, Predictor, register_method
from osfl.fl.seeds import derive_seed
from osfl.fl.training import init_model
from osfl.fl.upload import (
    NUM_SAMPLES,
    Broadcast,
    TensorSpec,
    Upload,
    UploadSpec,
    spec_from_state_dict,
)
from osfl.methods.clients import (
    average_states,
    member_problem,
    public_fl_hparams,
    sample_counts,
)
from osfl.methods.fafi.client import FAFINet, SaltLoss, TwoViews
from osfl.methods.fafi.fusion import (
    FUSIONS,
    SCORINGS,
    IFFIPredictor,
    NoiseSpec,
    global_prototypes,
    median_prototypes,
)
from osfl.methods.fafi.losses import DENOMINATORS, SIMILARITIES

PROTOTYPE_KINDS = ("auto", "learned", "head", "class_mean")
#: which prototype rows a client's optimiser moves: every row (Eq. 5), or only the rows of
#: the classes the client holds (the others stay the common initial anchors)
PROTO_UPDATES = ("all", "held")
FUSION_CHOICES = (*FUSIONS, "params")
_EXT = "extractor."


@dataclass(frozen=True)
class FAFIConfig:
    """FAFI's options; the defaults are the paper's (see docs/methods/fafi.md).

    tau=0.5 and N(0, 1) noise: paper Appendix E. Loss weights 1/1/0/0: Eq. 6
    (the public code's extra CE and prototype-separation terms are off).
    Negatives-only denominators and same-label positives: Eq. 4–5 as written.
    Cosine similarity and scoring: §4.2, Eq. 10. ``crop_scale`` (0.2, 1): the
    public code's RandomResizedCrop (the paper names no scale). The public
    code's recipe is :class:`FAFICodeConfig` (method ``fafi_code``).
    """

    tau: float = 0.5
    ssl_weight: float = 1.0
    proto_weight: float = 1.0
    ce_weight: float = 0.0
    sep_weight: float = 0.0
    ssl_labels: bool = True
    ssl_denominator: str = "negatives"
    proto_denominator: str = "negatives"
    ssl_tau: float | None = None
    proto_tau: float | None = None
    proto_similarity: str = "cosine"
    augment: str = "simclr"
    crop_scale: tuple[float, float] = (0.2, 1.0)
    prototypes: str = "auto"
    feature_dim: int | None = None
    proto_init_std: float = 1.0
    proto_update: str = "all"
    models: list[str] = field(default_factory=list)
    model_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    fusion: str = "iffi"
    scoring: str = "cosine"
    noise_mean: float = 0.0
    noise_std: float = 1.0
    noise_samples: int = 1
    normalize_features: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "crop_scale", tuple(float(v) for v in self.crop_scale))

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"method.fafi: {msg}")

        need(self.tau > 0, f"tau must be > 0, got {self.tau}")
        for name in ("ssl_tau", "proto_tau"):
            value = getattr(self, name)
            need(value is None or value > 0, f"{name} must be > 0 or null, got {value}")
        need(
            self.proto_similarity in SIMILARITIES,
            f"proto_similarity must be one of {', '.join(SIMILARITIES)}, "
            f"got {self.proto_similarity!r}",
        )
        need(
            self.proto_similarity == "cosine" or self.proto_denominator == "all",
            f"proto_similarity={self.proto_similarity!r} needs proto_denominator='all' "
            "(with the negatives-only denominator raw prototypes make L_proto unbounded below)",
        )
        need(
            self.scoring in SCORINGS,
            f"scoring must be one of {', '.join(SCORINGS)}, got {self.scoring!r}",
        )
        lo, hi = self.crop_scale if len(self.crop_scale) == 2 else (0.0, 0.0)
        need(
            len(self.crop_scale) == 2 and 0 < lo <= hi <= 1,
            f"crop_scale must be [lo, hi] with 0 < lo <= hi <= 1, got {list(self.crop_scale)}",
        )
        for name in ("ssl_weight", "proto_weight", "ce_weight", "sep_weight"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(
            self.ssl_weight + self.proto_weight + self.ce_weight > 0,
            "at least one of ssl_weight, proto_weight, ce_weight must be > 0",
        )
        for name in ("ssl_denominator", "proto_denominator"):
            need(
                getattr(self, name) in DENOMINATORS,
                f"{name} must be one of {', '.join(DENOMINATORS)}, got {getattr(self, name)!r}",
            )
        need(
            self.prototypes in PROTOTYPE_KINDS,
            f"prototypes must be one of {', '.join(PROTOTYPE_KINDS)}, got {self.prototypes!r}",
        )
        need(
            self.fusion in FUSION_CHOICES,
            f"fusion must be one of {', '.join(FUSION_CHOICES)}, got {self.fusion!r}",
        )
        kind = self.prototype_kind
        need(
            kind != "learned" or self.proto_weight > 0,
            "prototypes='learned' needs proto_weight > 0 (untrained prototypes are random)",
        )
        need(kind != "head" or self.ce_weight > 0, "prototypes='head' needs ce_weight > 0")
        need(
            self.feature_dim is None or self.feature_dim >= 1,
            f"feature_dim must be >= 1 or null, got {self.feature_dim}",
        )
        need(self.proto_init_std > 0, f"proto_init_std must be > 0, got {self.proto_init_std}")
        need(
            self.proto_update in PROTO_UPDATES,
            f"proto_update must be one of {', '.join(PROTO_UPDATES)}, got {self.proto_update!r}",
        )
        PIPELINES.get(self.augment)  # unknown pipeline -> ConfigError listing the valid ones
        NoiseSpec(self.noise_mean, self.noise_std, self.noise_samples)  # validates the noise

    @property
    def prototype_kind(self) -> str:
        """``auto`` resolved: learned prototypes when L_proto trains them, else the
        CE head's rows when CE trains a head, else per-class feature means."""
        if self.prototypes != "auto":
            return self.prototypes
        if self.proto_weight > 0:
            return "learned"
        return "head" if self.ce_weight > 0 else "class_mean"

    @property
    def plain_ce(self) -> bool:
        """SALT off: only the CE term (paper Table 3, first two rows)."""
        return self.ssl_weight == 0 and self.proto_weight == 0 and self.sep_weight == 0

    def salt_loss(self) -> SaltLoss:
        return SaltLoss(
            tau=self.tau,
            ssl_weight=self.ssl_weight,
            proto_weight=self.proto_weight,
            ce_weight=self.ce_weight,
            sep_weight=self.sep_weight,
            ssl_labels=self.ssl_labels,
            ssl_denominator=self.ssl_denominator,
            proto_denominator=self.proto_denominator,
            ssl_tau=self.ssl_tau,
            proto_tau=self.proto_tau,
            proto_similarity=self.proto_similarity,
        )


def _ce_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Plain CE through a FAFINet's projection and head (SALT off, with a projection)."""
    return F.cross_entropy(model.logits(model.features(x)).float(), y)


def find_normalize(transform: Transform) -> Normalize | None:
    """The last :class:`Normalize` of a (possibly nested) pipeline, or ``None``."""
    if isinstance(transform, Normalize):
        return transform
    found = None
    for t in transform.transforms if isinstance(transform, Compose) else ():
        found = find_normalize(t) or found
    return found


def class_mean_prototypes(
    net: FAFINet, data: ImageSet, transform: Transform, device: torch.device, batch: int = 256
) -> torch.Tensor:
    """C×D means of the client's normalised features per class; zero rows for
    classes it does not hold (the server averages over the clients that do)."""
    c = net.prototypes.shape[0]
    sums = torch.zeros(c, net.feature_dim, device=device)
    counts = torch.zeros(c, device=device)
    net.eval()
    with torch.no_grad():
        for i in range(0, len(data), batch):
            x = transform(data.images[i : i + batch].to(device))
            y = data.labels[i : i + batch].to(device)
            f = F.normalize(net.features(x).float(), dim=1)
            sums.index_add_(0, y, f)
            counts.index_add_(0, y, torch.ones_like(y, dtype=counts.dtype))
    return (sums / counts.clamp(min=1)[:, None]).cpu()


def masked_mean_prototypes(prototypes: list[torch.Tensor]) -> torch.Tensor:
    """Per class, the mean over the clients whose row is non-zero (class-mean prototypes)."""
    stack = torch.stack([p.float() for p in prototypes])
    present = (stack.abs().sum(-1) > 0).float()
    return (stack * present[..., None]).sum(0) / present.sum(0).clamp(min=1)[:, None]


@register_method("fafi")
class FAFI(Method):
    """Server state: ``{"init": {arch: FAFINet state}, "clients": {id: {...}}}``."""
    uploads: ClassVar[str] = "weights+prototypes"

    Config: ClassVar[type] = FAFIConfig
    smoke: ClassVar[tuple[str, ...]] = ("method.fafi.augment=flip",)
    one_shot: ClassVar[bool] = True
    default_run: ClassVar[bool] = True
    default_order: ClassVar[int] = 20

    def __init__(self, config: FAFIConfig, run: Any):
        super().__init__(config, run)
        self._specs: dict[str, dict[str, TensorSpec]] = {}

    # --- architectures ---------------------------------------------------
    def arch_of(self, client: int) -> str:
        """Client ``client``'s model name: ``models`` cycled, or the run's model."""
        models = list(self.config.models)
        return models[client % len(models)] if models else self.run.model.name

    def archs(self) -> list[str]:
        return sorted({self.arch_of(c) for c in range(self.run.num_clients)})

    def model_spec(self, arch: str) -> ModelSpec:
        """The run's model spec for the run's model; otherwise ``arch`` with the
        image's channels and size plus ``model_kwargs[arch]``."""
        if arch == self.run.model.name:
            return self.run.model
        c, h, _ = self.run.image_shape
        kwargs = {"in_chans": c, "img_size": h, **dict(self.config.model_kwargs.get(arch, {}))}
        return ModelSpec(arch, kwargs)

    def build_net(self, arch: str) -> FAFINet:
        backbone = self.model_spec(arch).build(self.run.num_classes)
        return FAFINet(backbone, self.run.num_classes, self.config.feature_dim)

    def initial_net(self, arch: str) -> FAFINet:
        """Common initial weights from the run seed only (built on the server).

        The run's own model gets exactly :func:`osfl.fl.training.init_model`'s
        weights (so plain-CE clients equal the FedAvg clients); the prototypes
        are the same for every architecture.
        """
        seed = self.run.seed
        with torch.random.fork_rng(devices=[]):
            if arch == self.run.model.name:
                backbone = init_model(self.run)
            else:
                torch.manual_seed(derive_seed(seed, "fafi-model-init", arch))
                backbone = self.model_spec(arch).build(self.run.num_classes)
            torch.manual_seed(derive_seed(seed, "fafi-init", arch))
            net = FAFINet(backbone, self.run.num_classes, self.config.feature_dim)
        gen = torch.Generator().manual_seed(derive_seed(seed, "fafi-prototypes"))
        with torch.no_grad():
            shape = (self.run.num_classes, net.feature_dim)
            net.prototypes.copy_(self.config.proto_init_std * torch.randn(shape, generator=gen))
        return net

    # --- protocol --------------------------------------------------------
    def init_state(self) -> dict[str, Any]:
        init = {}
        for arch in self.archs():
            net = self.initial_net(arch)
            init[arch] = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return {"init": init, "clients": {}}

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        tensors = {f"{arch}/{k}": v for arch, sd in state["init"].items() for k, v in sd.items()}
        return Broadcast(tensors=tensors)

    def salt_transform(self, data: ImageSet) -> Transform:
        """Two views of the ``augment`` pipeline at the evaluation resolution,
        normalised with the run's evaluation statistics."""
        probe = self.run.eval_transform(data.images[:1])
        c, h = probe.shape[1], probe.shape[2]
        norm = find_normalize(self.run.eval_transform)
        mean, std = (norm.mean, norm.std) if norm is not None else ((0.0,) * c, (1.0,) * c)
        if self.config.augment == "simclr":
            base = simclr_pipeline(h, mean, std, crop_scale=self.config.crop_scale)
        else:
            base = build_transform(self.config.augment, image_size=h, mean=mean, std=std)
        return TwoViews(base)

    def train_net(self, ctx: ClientContext, net: FAFINet, data: ImageSet, arch: str) -> FAFINet:
        cfg = self.run.train
        if self.config.plain_ce and net.head is None:
            # The plain model: same cache entry as FedAvg / Ensemble clients.
            train_client(ctx, data, model=net.backbone, cfg=cfg, extra_key=self._arch_key(arch))
            return net.eval()
        if self.config.plain_ce:
            loss, transform, objective = _ce_loss, None, "fafi-ce"
        else:
            loss, transform, objective = self.config.salt_loss(), self.salt_transform(data), "fafi"
        extra = {"arch": self._arch_key(arch), "feature_dim": self.config.feature_dim}
        if objective == "fafi":
            extra["salt"] = loss.key()
        hook = None
        if self.config.proto_update == "held" and objective == "fafi":
            extra["proto_update"] = "held"
            held = torch.bincount(data.labels, minlength=net.prototypes.shape[0]) > 0
            mask = held.to(net.prototypes.device, net.prototypes.dtype)[:, None]
            hook = net.prototypes.register_hook(lambda g: g * mask)
        try:
            train_client(
                ctx,
                data,
                model=net,
                cfg=cfg,
                transform=transform,
                loss_fn=loss,
                objective=objective,
                extra_key=extra,
            )
        finally:
            if hook is not None:
                hook.remove()
        return net.eval()

    def _arch_key(self, arch: str) -> Any:
        # None for the run's model keeps the key equal to the baselines' (shared cache).
        return None if arch == self.run.model.name else self.model_spec(arch).key()

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        arch = self.arch_of(ctx.client_id)
        prefix = f"{arch}/"
        init = {k[len(prefix) :]: v for k, v in broadcast.tensors.items() if k.startswith(prefix)}
        net = self.build_net(arch)
        net.load_state_dict(init, strict=True)
        net = self.train_net(ctx, net.to(ctx.device), data, arch)
        kind = self.config.prototype_kind
        if kind == "learned":
            protos = net.prototypes.detach()
        elif kind == "head":
            protos = net.head_weight().detach()
        else:
            protos = class_mean_prototypes(net, data, self.run.eval_transform, ctx.device)
        tensors = {_EXT + k: v for k, v in net.extractor().state_dict().items()}
        tensors["prototypes"] = protos.float().cpu()
        return Upload(tensors=tensors, meta={"num_samples": len(data)})

    # --- validation ------------------------------------------------------
    def _extractor_spec(self, state: dict[str, Any], arch: str) -> dict[str, TensorSpec]:
        if arch not in self._specs:  # BatchNorm variances >= 0, every float finite
            extractor = self._initial_extractor(state, arch).state_dict()
            self._specs[arch] = spec_from_state_dict(extractor, prefix=_EXT).tensors
        return self._specs[arch]

    def _initial_extractor(self, state: dict[str, Any], arch: str) -> nn.Module:
        net = self.build_net(arch)
        net.load_state_dict(state["init"][arch])
        return net.extractor()

    def _proto_spec(self, state: dict[str, Any]) -> TensorSpec:
        d = next(iter(state["init"].values()))["prototypes"].shape[1]
        return TensorSpec((self.run.num_classes, d), torch.float32)

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        """Exactly client ``client``'s extractor keys/shapes (its own architecture)
        + its C×D prototypes + ``num_samples``."""
        tensors = {**self._extractor_spec(state, self.arch_of(client))}
        tensors["prototypes"] = self._proto_spec(state)
        return UploadSpec(tensors=tensors, meta={"num_samples": NUM_SAMPLES})

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
            module = self.build_net(arch).extractor()
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
        return {"init": state["init"], "clients": clients}

    # --- inference -------------------------------------------------------
    def global_prototypes(self, state: dict[str, Any]) -> torch.Tensor:
        protos = [state["clients"][c]["prototypes"] for c in sorted(state["clients"])]
        if self.config.fusion == "median":  # robust: one hostile client cannot drag a row
            return median_prototypes(protos)
        if self.config.prototype_kind == "class_mean":
            return masked_mean_prototypes(protos)
        return global_prototypes(protos)

    def extractor_of(self, state: dict[str, Any], client: int) -> nn.Module:
        ext = self.build_net(self.arch_of(client)).extractor()
        ext.load_state_dict(state["clients"][client]["extractor"], strict=True)
        return ext.eval()

    def predictor(self, state: dict[str, Any]) -> Predictor:
        ids = sorted(state["clients"])
        protos = self.global_prototypes(state)
        cfg = self.config
        if cfg.fusion == "params":
            if len({self.arch_of(c) for c in ids}) > 1:
                raise ConfigError(
                    "method.fafi: fusion='params' averages parameters and needs one "
                    "architecture for all clients; use fusion='iffi' or 'average'"
                )
            weights = [state["clients"][c]["num_samples"] for c in ids]
            avg = average_states([state["clients"][c]["extractor"] for c in ids], weights)
            ext = self.build_net(self.arch_of(ids[0])).extractor()
            ext.load_state_dict(avg, strict=True)
            return IFFIPredictor([ext.eval()], protos, fusion="average", scoring=cfg.scoring)
        noise = NoiseSpec(
            cfg.noise_mean,
            cfg.noise_std,
            cfg.noise_samples,
            derive_seed(self.run.seed, "fafi-noise"),
        )
        return IFFIPredictor(
            [self.extractor_of(state, c) for c in ids],
            protos,
            fusion=cfg.fusion,
            noise=noise if cfg.fusion == "iffi" else None,
            normalize_features=cfg.normalize_features,
            client_weights=[float(state["clients"][c]["num_samples"]) for c in ids],
            scoring=cfg.scoring,
        )

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp


@dataclass(frozen=True)
class FAFICodeConfig(FAFIConfig):
    """The public code's recipe (github.com/zenghui9977/FAFI_ICML25,
    ``our_local_training.py`` / ``our_main.py``) as defaults; every other
    option is FAFI's (see docs/methods/fafi.md, "The code variant").

    * SupCon on the normalised features at τ 0.07 (``SupConLoss(temperature=0.07)``,
      every other sample in the denominator);
    * normalised feature · *raw* learnable prototypes with a full-softmax CE at
      temperature 1; the code adds this CE twice (``cls_loss`` on the model's
      logits and ``Contrastive_proto_feature_loss(temperature=1.0)``, the same
      quantity), hence ``proto_weight=2``;
    * prototype self-separation ``CE(P·Pᵀ, 0..C-1)`` on the raw prototypes
      (``Contrastive_proto_loss(temperature=1.0)``);
    * inference: the data-size-weighted mean of the client features
      (``WEnsembleFeature``), normalised, dot product with the raw mean
      prototypes (``eval_with_proto``) — IFFI's noise weighting is not run;
    * its gradient-norm clipping at 1 is a local-training default of the
      method ``fafi_code`` (``train_defaults``), not an option here.
    """

    ssl_denominator: str = "all"
    ssl_tau: float | None = 0.07
    proto_weight: float = 2.0
    proto_denominator: str = "all"
    proto_tau: float | None = 1.0
    proto_similarity: str = "unit_feature"
    sep_weight: float = 1.0
    fusion: str = "data_size"
    scoring: str = "unit_feature"


@register_method("fafi_code")
class FAFICode(FAFI):
    """FAFI with the public code's recipe as defaults (docs/design.md §8: the code
    variant kept where it matters for published numbers), its gradient-norm
    clipping at 1 included, as a local-training default."""

    Config: ClassVar[type] = FAFICodeConfig
    train_defaults: ClassVar[Mapping[str, Any]] = {"grad_clip": 1.0}
    smoke: ClassVar[tuple[str, ...]] = ("method.fafi_code.augment=flip",)
    default_run: ClassVar[bool] = False
    default_order: ClassVar[int] = 21
