"""The label-recovery attack contract: an Observation (+ auxiliary set) in,
recovered counts per class out.

An attack consumes plain, documented data — the broadcast global weights, the
client's uploaded weights and the public training hyper-parameters of an
:class:`~osfl.fl.observation.Observation` — so it runs on any model without
the simulator, as breaching's ``_BaseAttacker.reconstruct(server_payload,
shared_data)`` does [Geiping et al., NeurIPS 2020]. What each attack reads:

- ``obs.broadcast``: the global state dict θ^(t) (extra, non-model keys are
  allowed and ignored by the model);
- ``obs.history``: the scheme state the server knows of the client
  (``history.<scheme>.<name>.<param>``; RLU's ``h`` term);
- ``obs.upload``: the client's local state dict θ_k^(t) after its local steps;
- ``obs.hparams["train"]``: ``lr``, ``batch_size``, ``steps`` *or* ``epochs``
  (+ ``upload_meta["num_samples"]`` to count steps), ``optimizer``,
  ``momentum``, ``weight_decay``, ``drop_last`` (TrainConfig.public_hparams);
- ``obs.hparams["fl"]``: ``scheme`` (``fedavg`` when absent) and its constants
  (``mu``, ``alpha``, ...);
- ``obs.hparams["model"]`` = ``{"name", "kwargs"}`` and
  ``obs.hparams["num_classes"]`` to rebuild the architecture, unless the
  caller passes ``model=`` (an ``nn.Module`` of the right architecture).

The local *update* is ``Δθ = upload − broadcast``. Attacks that want a
gradient (LLG+, ZLG+, iRLG, iDLG) use the surrogate ``G = −Δθ/η · |B|`` (the
*sum* over the ``m·|B|`` samples of their per-sample gradients, exact for
plain SGD with equal batches); RLU instead models the update itself (Eq. 16).

Results are :class:`LabelRecoveryResult`: integer counts per class summing to
the number of labels the client used, ``m·|B|`` (Appendix B.4).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.errors import ConfigError, DataError
from osfl.models import create_model
from osfl.privacy.label_recovery.moments import aux_outputs
from osfl.privacy.metrics import label_metrics
from osfl.registry import Registry

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.fl.observation import Observation

Transform = Any  # a callable uint8 B×C×H×W -> float model input


class ObservationError(DataError):
    """An Observation an attack cannot use; the message names the field."""

    def __init__(
        self, message: str, *, field: str, client: int | None = None, round: int | None = None
    ):
        self.field = field
        where = [f"field {field!r}"]
        if client is not None:
            where.insert(0, f"client {client}, round {round}")
        super().__init__(f"observation [{', '.join(where)}]: {message}")


# ------------------------------------------------------------------ result
@dataclass(frozen=True)
class LabelRecoveryResult:
    """Recovered label counts (int64, one per class) and attack diagnostics."""

    attack: str
    counts: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        c = np.asarray(self.counts)
        if c.ndim != 1 or (c.size and (c.min() < 0 or not np.issubdtype(c.dtype, np.integer))):
            raise ValueError("counts must be a 1-D array of non-negative integers")
        object.__setattr__(self, "counts", c.astype(np.int64))

    @property
    def num_labels(self) -> int:
        return int(self.counts.sum())

    def labels(self) -> np.ndarray:
        """The recovered multiset of labels, sorted (order is not recoverable)."""
        return np.repeat(np.arange(self.counts.size), self.counts)

    def score(self, truth: np.ndarray | torch.Tensor) -> dict[str, float]:
        """cAcc and iAcc (Appendix B.4) against the true labels of the local steps."""
        return label_metrics(self.counts, truth, num_classes=self.counts.size)


# ------------------------------------------------------------------ what the server knows
@dataclass(frozen=True)
class LocalTraining:
    """The public local-training recipe of one observation."""

    lr: float
    batch_size: int
    steps: int
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    scheme: str = "fedavg"
    scheme_params: Mapping[str, Any] = field(default_factory=dict)
    batch_sizes: tuple[int, ...] = ()

    @property
    def nesterov(self) -> bool:
        return self.optimizer == "nesterov"

    @property
    def total_labels(self) -> int:
        """``Σ_τ |B_τ|`` (= m·|B| when every batch is full)."""
        return int(sum(self.batch_sizes)) if self.batch_sizes else self.steps * self.batch_size


def _step_batch_sizes(
    num_samples: int, batch_size: int, steps: int, drop_last: bool
) -> tuple[int, ...]:
    """Batch sizes of ``steps`` steps cycling over epochs of ``num_samples`` (BatchIterator order)."""
    full, rest = divmod(num_samples, batch_size)
    epoch = [batch_size] * full + ([rest] if rest and not drop_last else [])
    if not epoch:
        return ()
    return tuple(epoch[i % len(epoch)] for i in range(steps))


def _hp(obs: Observation, key: str, default: Any = None) -> Any:
    """``hparams['train'][key]``, falling back to a top-level ``hparams[key]``."""
    train = obs.hparams.get("train") or {}
    if key in train:
        return train[key]
    return obs.hparams.get(key, default)


def local_training(obs: Observation, steps: int | None = None) -> LocalTraining:
    """Parse and check the public hyper-parameters of ``obs``."""
    lr, bs = _lr_and_batch_size(obs)
    n = obs.upload_meta.get("num_samples")
    drop_last = bool(_hp(obs, "drop_last", False))
    steps = _local_steps(obs, steps, n, bs, drop_last)
    sizes = _step_batch_sizes(n, bs, steps, drop_last) if isinstance(n, int) and n > 0 else ()
    optimizer = str(_hp(obs, "optimizer", "sgd")).lower()
    momentum = float(_hp(obs, "momentum", 0.0) or 0.0)
    if optimizer in ("sgd", "adam", "adamw"):
        momentum = 0.0
    fl = dict(obs.hparams.get("fl") or {})
    scheme = str(fl.pop("scheme", obs.hparams.get("scheme", "fedavg"))).lower()
    return LocalTraining(
        lr=float(lr),
        batch_size=bs,
        steps=int(steps),
        optimizer=optimizer,
        momentum=momentum,
        weight_decay=float(_hp(obs, "weight_decay", 0.0) or 0.0),
        scheme=scheme,
        scheme_params=fl,
        batch_sizes=sizes,
    )


def _bad(obs: Observation, msg: str, fld: str) -> ObservationError:
    """An error naming the field, client and round of ``obs`` at fault."""
    return ObservationError(msg, field=fld, client=obs.client_id, round=obs.round)


def _lr_and_batch_size(obs: Observation) -> tuple[float, int]:
    """The learning rate (positive, finite) and batch size (a positive int,
    never a bool): the attacks divide and count by them."""
    lr = _hp(obs, "lr")
    if not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
        raise _bad(obs, f"needs a positive learning rate, got {lr!r}", "hparams.train.lr")
    bs = _hp(obs, "batch_size")
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise _bad(
            obs, f"needs a positive integer batch size, got {bs!r}", "hparams.train.batch_size"
        )
    return lr, bs


def _local_steps(obs: Observation, steps: int | None, n: Any, bs: int, drop_last: bool) -> int:
    """The number of local steps: given, recorded (``hparams.train.steps``),
    or ``epochs`` times the batches an epoch of ``n`` samples holds."""
    if steps is None:
        steps = _hp(obs, "steps")
    if steps is None:
        epochs = _hp(obs, "epochs")
        if not isinstance(n, int) or not isinstance(epochs, int):
            raise _bad(
                obs,
                "the number of local steps is unknown: record hparams.train.steps, or "
                "hparams.train.epochs and upload_meta.num_samples (or pass steps=)",
                "hparams.train.steps",
            )
        per_epoch = n // bs if drop_last else math.ceil(n / bs)
        steps = epochs * per_epoch
    if not isinstance(steps, int) or steps < 1:
        raise _bad(
            obs, f"local steps must be a positive integer, got {steps!r}", "hparams.train.steps"
        )
    return steps


def classifier_name(model: nn.Module) -> str:
    """Qualified module name of ``model.get_classifier()`` (the last Linear)."""
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear):
        raise ConfigError(
            f"{type(model).__name__} has no get_classifier() returning an nn.Linear; "
            "label-recovery attacks read the last linear layer"
        )
    for name, mod in model.named_modules():
        if mod is head:
            return name
    raise ConfigError("get_classifier() returned a layer that is not a submodule of the model")


@dataclass
class AttackInputs:
    """An Observation resolved into what attacks compute with.

    ``global_model`` / ``local_model`` hold θ^(t) and θ_k^(t) (eval mode);
    ``W0, b0`` are the global classifier weights; ``dW, db`` its local update
    (float64 numpy). ``train`` is the public recipe.
    """

    obs: Observation
    train: LocalTraining
    global_model: nn.Module
    local_model: nn.Module
    head: str
    W0: np.ndarray
    b0: np.ndarray
    dW: np.ndarray
    db: np.ndarray
    _memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    @property
    def num_classes(self) -> int:
        return int(self.b0.shape[0])

    @property
    def total_labels(self) -> int:
        return self.train.total_labels

    def bad(self, msg: str, fld: str) -> ObservationError:
        return ObservationError(msg, field=fld, client=self.obs.client_id, round=self.obs.round)

    def history(self, name: str) -> np.ndarray | None:
        """The bias entries of a recorded history tensor ``<name>.<head>.bias``, if present."""
        key = f"{name}.{self.head}.bias"
        t = self.obs.history.get(key)
        if t is None:
            return None
        if tuple(t.shape) != (self.num_classes,):
            raise self.bad(f"shape {tuple(t.shape)}, expected ({self.num_classes},)", key)
        return t.detach().double().cpu().numpy()

    def aux_outputs(
        self,
        which: str,
        aux: ImageSet,
        transform: Transform | None,
        *,
        bn_stats: str,
        device: torch.device,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and embeddings of ``aux`` under the ``"global"`` or ``"local"`` model,
        memoised so that several attacks on one observation forward the set once."""
        key = (which, id(aux), id(transform), bn_stats, str(device), seed)
        if key not in self._memo:
            model = (self.global_model if which == "global" else self.local_model).to(device)
            self._memo[key] = aux_outputs(
                model,
                aux.images,
                transform=transform,
                batch_size=self.train.batch_size,
                bn_stats=bn_stats,
                device=device,
                seed=seed,
            )
        return self._memo[key]

    def gradient_surrogate(self) -> tuple[np.ndarray, np.ndarray]:
        """``(G_W, G_b)``: the sum over all ``m·|B|`` samples of their last-layer gradients,
        ``−Δθ/η · |B|``, exact for plain SGD with full, equal batches."""
        scale = self.train.total_labels / (self.train.steps * self.train.lr)
        return -self.dW * scale, -self.db * scale


def build_model(obs: Observation, model: nn.Module | None) -> nn.Module:
    """A template of the observed architecture (a deep copy of ``model`` if given)."""
    if model is not None:
        return copy.deepcopy(model)
    spec = obs.hparams.get("model")
    k = obs.hparams.get("num_classes")
    if not isinstance(spec, Mapping) or "name" not in spec or not isinstance(k, int):
        raise ObservationError(
            "cannot rebuild the model: record hparams.model = {name, kwargs} and "
            "hparams.num_classes, or pass model= to the attack",
            field="hparams.model",
            client=obs.client_id,
            round=obs.round,
        )
    return create_model(str(spec["name"]), num_classes=k, **dict(spec.get("kwargs") or {}))


def _load(
    model: nn.Module, state: Mapping[str, torch.Tensor], where: str, obs: Observation
) -> None:
    ref = model.state_dict()
    for key, t in ref.items():
        if key not in state:
            raise ObservationError(
                f"missing tensor {key!r} of the model ({len(ref)} tensors expected)",
                field=f"{where}[{key}]",
                client=obs.client_id,
                round=obs.round,
            )
        got = state[key]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(t.shape):
            raise ObservationError(
                f"shape {tuple(getattr(got, 'shape', ()))}, expected {tuple(t.shape)}",
                field=f"{where}[{key}]",
                client=obs.client_id,
                round=obs.round,
            )
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise ObservationError(
                "contains NaN or Inf",
                field=f"{where}[{key}]",
                client=obs.client_id,
                round=obs.round,
            )
    model.load_state_dict({k: state[k] for k in ref}, strict=True)


def resolve(
    obs: Observation, *, model: nn.Module | None = None, steps: int | None = None
) -> AttackInputs:
    """Check ``obs`` and turn it into :class:`AttackInputs` (clear errors on bad input)."""
    train = local_training(obs, steps)
    template = build_model(obs, model)
    head = classifier_name(template)
    g = copy.deepcopy(template)
    loc = template
    _load(g, obs.broadcast, "broadcast", obs)
    _load(loc, obs.upload, "upload", obs)
    g.eval()
    loc.eval()
    lin_g, lin_l = g.get_classifier(), loc.get_classifier()
    if lin_g.bias is None:
        raise ObservationError(
            "the classifier has no bias; these attacks read the output-layer bias update",
            field=f"broadcast[{head}.bias]",
            client=obs.client_id,
            round=obs.round,
        )
    W0 = lin_g.weight.detach().double().numpy().copy()
    b0 = lin_g.bias.detach().double().numpy().copy()
    dW = lin_l.weight.detach().double().numpy() - W0
    db = lin_l.bias.detach().double().numpy() - b0
    return AttackInputs(obs, train, g, loc, head, W0, b0, dW, db)


# ------------------------------------------------------------------ attack base + registry
#: Who runs an attack and what they see (every audit row says which).
THREAT_MODELS: dict[str, str] = {
    "honest-but-curious server": (
        "follows the protocol and reads each client's update (an eavesdropper on a link "
        "without TLS sees the same)"
    ),
    "malicious server": "may also choose the model or code it sends the clients",
}


class LabelAttack(ABC):
    """Base of every label-recovery attack: ``Config`` (frozen dataclass) + ``recover``.

    ``threat_model`` (a key of :data:`THREAT_MODELS`): who can run it. Every
    attack here reads one client's update of one round against the global
    model it started from, so an honest-but-curious server can."""

    name: ClassVar[str] = "attack"
    Config: ClassVar[type] = object
    needs_aux: ClassVar[bool] = True
    threat_model: ClassVar[str] = "honest-but-curious server"

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    def recover(
        self,
        obs: Observation | AttackInputs,
        aux: ImageSet | None = None,
        *,
        model: nn.Module | None = None,
        transform: Transform | None = None,
        device: torch.device | str = "cpu",
        steps: int | None = None,
    ) -> LabelRecoveryResult:
        """Recover the label counts of ``obs``; ``aux`` is the server's auxiliary set.

        ``transform`` maps uint8 auxiliary images to model inputs (the
        clients' evaluation transform; default ``x/255``); ``steps`` overrides
        the number of local steps read from the observation.
        """
        inputs = obs if isinstance(obs, AttackInputs) else resolve(obs, model=model, steps=steps)
        if self.needs_aux:
            if aux is None or len(aux) == 0:
                raise ConfigError(f"attack {self.name!r} needs an auxiliary ImageSet (aux=)")
            if aux.num_classes != inputs.num_classes:
                raise ConfigError(
                    f"auxiliary set has {aux.num_classes} classes, the model {inputs.num_classes}"
                )
        counts, info = self._recover(inputs, aux, transform, torch.device(device))
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (inputs.num_classes,) or counts.sum() != inputs.total_labels:
            raise RuntimeError(  # a bug in the attack, not a user error
                f"{self.name}: counts {counts.tolist()} do not sum to {inputs.total_labels}"
            )
        return LabelRecoveryResult(self.name, counts, info)

    @abstractmethod
    def _recover(
        self,
        x: AttackInputs,
        aux: ImageSet | None,
        transform: Transform | None,
        device: torch.device,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Counts per class (summing to ``x.total_labels``) and diagnostics."""


ATTACKS: Registry[type[LabelAttack]] = Registry("attack")


def register_attack(name: str):
    """Class decorator: register a :class:`LabelAttack` under ``name``."""

    def deco(cls: type[LabelAttack]) -> type[LabelAttack]:
        cls.name = name.lower()
        ATTACKS.add(name, cls)
        return cls

    return deco


def make_config(cls: type[LabelAttack], options: Mapping[str, Any]) -> Any:
    """``cls.Config(**options)``; an unknown option is a ConfigError listing the valid ones."""
    valid = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ConfigError(
            f"attack {cls.name!r} has no option(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(valid)) or '(none)'}"
        )
    return cls.Config(**options)
