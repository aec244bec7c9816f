"""Client-side defences on the transmitted update: norm clipping + Gaussian noise.

Chen & Vikalo [ICML 2024, §4.10, Table 6] defend against label recovery by
adding zero-mean Gaussian noise of standard deviation ``sigma`` to what the
client transmits, the Gaussian mechanism of DP-SGD [Abadi et al., CCS 2016]
applied once per round to the local update as in DP-FedAvg [McMahan et al.,
"Learning Differentially Private Recurrent Language Models", ICLR 2018]::

    Delta  = upload - broadcast                       (the local update)
    Delta <- Delta * min(1, clip / ||Delta||_2)        (if clip is set; joint L2 norm)
    Delta <- Delta + N(0, sigma² I)                    (if sigma > 0)
    upload = broadcast + Delta

It is a cross-cutting concern, so it wraps a :class:`~osfl.fl.method.Method`
(:class:`DefendedMethod`) the way Flower's
``DifferentialPrivacyClientSideFixedClipping`` wraps a strategy, rather than
living inside any method: every method gets it from the config's ``defense:
{clip: ..., sigma: ...}`` (:func:`apply_defense`). The noise is seeded by the
run seed, the client and the round, so a run is reproducible. ``sigma`` is an
absolute standard deviation, as in Table 6 (not a multiple of ``clip``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from osfl.config import options_config
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, RunContext
from osfl.fl.method import Method, MethodWrapper
from osfl.fl.upload import Broadcast, Upload
from osfl.registry import Registry

log = logging.getLogger(__name__)

#: Which upload tensors a defence perturbs: scope name -> selector(names, upload, broadcast)
SCOPES: Registry[Any] = Registry("defence scope")


@dataclass(frozen=True)
class DefenseConfig:
    """``clip``: L2 bound on the update (``None``: no clipping). ``sigma``: std
    of the Gaussian noise per coordinate (0: none). ``scope``: ``parameters``
    (the model's trainable parameters, the default: BatchNorm statistics are
    not gradients, and noise on a running variance can make it negative),
    ``state`` (every float tensor of the model state) or ``all`` (also the
    method's other float upload tensors, e.g. SCAFFOLD's ``Delta c_i``, taken
    as values where the broadcast has no counterpart)."""

    clip: float | None = None
    sigma: float = 0.0
    scope: str = "parameters"

    def __post_init__(self) -> None:
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise ConfigError(f"defense.clip must be > 0 (or null), got {self.clip}")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ConfigError(f"defense.sigma must be >= 0, got {self.sigma}")
        SCOPES.get(self.scope)

    @property
    def active(self) -> bool:
        return self.clip is not None or self.sigma > 0


def clip_and_noise(
    update: Mapping[str, torch.Tensor],
    *,
    clip: float | None,
    sigma: float,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Clip ``update`` (named float tensors) to joint L2 norm ``clip``, then add
    ``N(0, sigma²)`` to every coordinate. Returns the new tensors (same dtypes)
    and ``{"norm": norm before clipping, "scale": clipping factor}``.

    Computed in float64 so that the clipped norm is ``clip`` to rounding; the
    noise is drawn on the CPU from ``generator`` in sorted key order
    (reproducible whatever the device).
    """
    keys = sorted(update)
    norm = math.sqrt(sum(float((update[k].to(torch.float64) ** 2).sum()) for k in keys))
    scale = 1.0 if clip is None or norm <= clip else clip / norm
    out: dict[str, torch.Tensor] = {}
    for k in keys:
        t = update[k]
        v = t.detach().to("cpu", torch.float64) * scale
        if sigma > 0:
            v = v + sigma * torch.randn(v.shape, generator=generator, dtype=torch.float64)
        out[k] = v.to(t.dtype)
    return out, {"norm": norm, "scale": scale}


@SCOPES.register("parameters")
def _parameters(names: ModelNames, upload: Upload, broadcast: Broadcast) -> tuple[list, list]:
    return [k for k in names.parameters if k in upload.tensors and k in broadcast.tensors], []


@SCOPES.register("state")
def _state(names: ModelNames, upload: Upload, broadcast: Broadcast) -> tuple[list, list]:
    keys = [
        k
        for k in names.state
        if k in upload.tensors and k in broadcast.tensors and upload.tensors[k].is_floating_point()
    ]
    return keys, []


@SCOPES.register("all")
def _all(names: ModelNames, upload: Upload, broadcast: Broadcast) -> tuple[list, list]:
    deltas, values = [], []
    for k, v in upload.tensors.items():
        if not v.is_floating_point():
            continue
        b = broadcast.tensors.get(k)
        (deltas if b is not None and b.shape == v.shape else values).append(k)
    return deltas, values


@dataclass(frozen=True)
class ModelNames:
    """The run model's trainable parameter names and state-dict keys."""

    parameters: tuple[str, ...]
    state: tuple[str, ...]

    @classmethod
    def of(cls, run: RunContext) -> ModelNames:
        model = run.model.build_meta(run.num_classes)
        params = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        return cls(params, tuple(model.state_dict()))


class DefendedMethod(MethodWrapper):
    """``inner`` whose every upload is clipped and noised on the client.

    Everything else (rounds, broadcast, aggregation, predictor, hooks) is the
    inner method's (:class:`~osfl.fl.method.MethodWrapper`); the public
    hyper-parameters gain ``defense`` (a DP mechanism is public).
    """

    def __init__(self, inner: Method, defense: DefenseConfig):
        super().__init__(inner)
        self.defense = defense
        self._names: ModelNames | None = None

    def public_hparams(self) -> dict[str, Any]:
        return {**self.inner.public_hparams(), "defense": dataclasses.asdict(self.defense)}

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: Any) -> Upload:
        upload = self.inner.client_update(ctx, broadcast, data)
        return self.protect(ctx, broadcast, upload)

    def protect(self, ctx: ClientContext, broadcast: Broadcast, upload: Upload) -> Upload:
        """The upload with its update clipped and noised (a new Upload)."""
        d = self.defense
        if self._names is None:
            self._names = ModelNames.of(self.run)
        deltas, values = SCOPES.get(d.scope)(self._names, upload, broadcast)
        update = {
            k: upload.tensors[k].detach().to("cpu") - broadcast.tensors[k].to("cpu") for k in deltas
        }
        update.update({k: upload.tensors[k].detach().to("cpu") for k in values})
        gen = torch.Generator().manual_seed(ctx.seed_for("defense"))
        noisy, info = clip_and_noise(update, clip=d.clip, sigma=d.sigma, generator=gen)
        log.debug(
            "client %d round %d: update norm %.4g, clip scale %.4g, noise sigma %g",
            ctx.client_id,
            ctx.round,
            info["norm"],
            info["scale"],
            d.sigma,
        )
        tensors = dict(upload.tensors)
        for k in deltas:
            tensors[k] = (broadcast.tensors[k].to("cpu") + noisy[k]).to(upload.tensors[k].dtype)
        for k in values:
            tensors[k] = noisy[k]
        return Upload(tensors=tensors, meta=dict(upload.meta))


def defense_config(spec: Mapping[str, Any] | DefenseConfig | None) -> DefenseConfig | None:
    """The config's ``defense`` mapping as a :class:`DefenseConfig` (``None``
    when empty); unknown options are a ConfigError listing the valid ones."""
    if spec is None or isinstance(spec, DefenseConfig):
        return spec
    if not spec:
        return None
    return options_config(DefenseConfig, spec, "defense")


def apply_defense(method: Method, spec: Mapping[str, Any] | DefenseConfig | None) -> Method:
    """``method`` wrapped in :class:`DefendedMethod` when ``spec`` (the config's
    ``defense`` mapping) asks for clipping or noise; else ``method`` itself."""
    cfg = defense_config(spec)
    return DefendedMethod(method, cfg) if cfg is not None and cfg.active else method
