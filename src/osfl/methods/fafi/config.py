"""FAFI's options (:class:`FAFIConfig`) and the public code's (:class:`FAFICodeConfig`).

Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025; every default and
its source is in docs/methods/fafi.md. Each option is declared once: the
client objective's are :class:`~osfl.methods.fafi.salt.SaltLoss` itself
(``method.fafi.loss.tau=0.3``), IFFI's noise is
:class:`~osfl.methods.fafi.fusion.NoiseSpec` (``method.fafi.noise.std=5``),
and the local-training recipe is the run's (``method_train.fafi.*``), so
none of them is repeated here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from osfl.data.transforms import PIPELINES
from osfl.errors import ConfigError
from osfl.methods.fafi.fusion import FUSIONS, SCORINGS, NoiseSpec
from osfl.methods.fafi.salt import SaltLoss

PROTOTYPE_KINDS = ("auto", "learned", "head", "class_mean")
#: which prototype rows a client's optimiser moves: every row (Eq. 5), or only the rows of
#: the classes the client holds (the others stay the common initial anchors)
PROTO_UPDATES = ("all", "held")
FUSION_CHOICES = (*FUSIONS, "params")


@dataclass(frozen=True)
class FAFIConfig:
    """FAFI's options; the defaults are the paper's (see docs/methods/fafi.md).

    ``loss``: SALT (Eq. 4–6; tau 0.5, Appendix E). ``augment``/``crop_scale``:
    the two views (``crop_scale`` (0.2, 1): the public code's RandomResizedCrop;
    the paper names no scale). ``prototypes``: what a client uploads as its
    C×D prototypes (``auto``: :attr:`prototype_kind`), ``proto_init_std``
    their common initial N(0, std²) draw, ``proto_update`` the rows a client
    trains. ``feature_dim``/``models``/``model_kwargs``: each client's
    architecture (Table 8). ``fusion``/``scoring``/``noise``/
    ``normalize_features``: the server's inference (IFFI, Eq. 8–10, N(0, 1)
    noise of Appendix E). The public code's recipe is :class:`FAFICodeConfig`
    (method ``fafi_code``).
    """

    #: the clients' SALT loss
    loss: SaltLoss = field(default_factory=SaltLoss)
    #: augmentation pipeline of the two views each client trains on (simclr, crop_flip, flip, none)
    augment: str = "simclr"
    #: area range of the simclr pipeline's random resized crop
    crop_scale: tuple[float, float] = (0.2, 1.0)
    #: what a client sends as class prototypes: learned, head, class_mean, or auto (from the loss
    #: weights)
    prototypes: str = "auto"
    #: feature size after a projection (null: the backbone's own; needed to fuse different
    #: architectures)
    feature_dim: int | None = None
    #: standard deviation of the prototypes' common random initialisation
    proto_init_std: float = 1.0
    #: prototype rows a client trains: all, or held (only the classes it holds)
    proto_update: str = "all"
    #: per-client architectures, cycled over the clients (empty: every client uses model.name)
    models: list[str] = field(default_factory=list)
    #: keyword arguments per architecture named in models ({arch: {key: value}})
    model_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: how the server fuses the clients' features: iffi (noise-weighted), average, data_size or
    #: params
    fusion: str = "iffi"
    #: how fused features are scored against the prototypes: cosine or unit_feature
    scoring: str = "cosine"
    #: the noise images IFFI weights the clients' features with
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    #: L2-normalise each client's feature before fusing
    normalize_features: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "crop_scale", tuple(float(v) for v in self.crop_scale))

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        def one_of(name: str, valid: tuple[str, ...]) -> None:
            value = getattr(self, name)
            need(value in valid, f"{name} must be one of {', '.join(valid)}, got {value!r}")

        one_of("scoring", SCORINGS)
        one_of("prototypes", PROTOTYPE_KINDS)
        one_of("fusion", FUSION_CHOICES)
        one_of("proto_update", PROTO_UPDATES)
        lo, hi = self.crop_scale if len(self.crop_scale) == 2 else (0.0, 0.0)
        need(
            len(self.crop_scale) == 2 and 0 < lo <= hi <= 1,
            f"crop_scale must be [lo, hi] with 0 < lo <= hi <= 1, got {list(self.crop_scale)}",
        )
        kind = self.prototype_kind
        need(
            kind != "learned" or self.loss.proto_weight > 0,
            "prototypes='learned' needs loss.proto_weight > 0 (untrained prototypes are random)",
        )
        need(
            kind != "head" or self.loss.ce_weight > 0, "prototypes='head' needs loss.ce_weight > 0"
        )
        need(
            self.feature_dim is None or self.feature_dim >= 1,
            f"feature_dim must be >= 1 or null, got {self.feature_dim}",
        )
        need(self.proto_init_std > 0, f"proto_init_std must be > 0, got {self.proto_init_std}")
        PIPELINES.get(self.augment)  # unknown pipeline -> ConfigError listing the valid ones

    @property
    def prototype_kind(self) -> str:
        """``auto`` resolved: learned prototypes when L_proto trains them, else the
        CE head's rows when CE trains a head, else per-class feature means."""
        if self.prototypes != "auto":
            return self.prototypes
        if self.loss.proto_weight > 0:
            return "learned"
        return "head" if self.loss.ce_weight > 0 else "class_mean"


#: The public code's SALT (github.com/zenghui9977/FAFI_ICML25,
#: ``our_local_training.py``): SupCon at τ 0.07 on the normalised features
#: (``SupConLoss(temperature=0.07)``, every other sample in the denominator);
#: normalised feature · *raw* learnable prototypes with a full-softmax CE at
#: temperature 1, added twice (``cls_loss`` on the model's logits and
#: ``Contrastive_proto_feature_loss(temperature=1.0)`` are the same quantity,
#: hence ``proto_weight=2``); prototype self-separation ``CE(P·Pᵀ, 0..C-1)`` on
#: the raw prototypes (``Contrastive_proto_loss(temperature=1.0)``).
CODE_LOSS = SaltLoss(
    ssl_denominator="all",
    ssl_tau=0.07,
    proto_weight=2.0,
    proto_denominator="all",
    proto_tau=1.0,
    proto_similarity="unit_feature",
    sep_weight=1.0,
)


@dataclass(frozen=True)
class FAFICodeConfig(FAFIConfig):
    """The public code's recipe (github.com/zenghui9977/FAFI_ICML25,
    ``our_local_training.py`` / ``our_main.py``) as defaults; every other
    option is FAFI's (see docs/methods/fafi.md, "The code variant").

    * ``loss``: :data:`CODE_LOSS`;
    * inference: the data-size-weighted mean of the client features
      (``WEnsembleFeature``), normalised, dot product with the raw mean
      prototypes (``eval_with_proto``) — IFFI's noise weighting is not run;
    * its gradient-norm clipping at 1 is a local-training default of the
      method ``fafi_code`` (``card.train_defaults``), not an option here.
    """

    loss: SaltLoss = field(default_factory=lambda: CODE_LOSS)
    fusion: str = "data_size"
    scoring: str = "unit_feature"
