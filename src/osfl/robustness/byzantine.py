"""Byzantine clients as an experiment: named simulated clients replace their
honest upload by poison (``byzantine: {clients: [0], kind: sign_flip}``).

Measuring robustness is what this field does (Blanchard et al., NeurIPS 2017;
Yin et al., ICML 2018; Fang et al., "Local Model Poisoning Attacks to
Byzantine-Robust Federated Learning", USENIX Security 2020). The poisons are
the classic ones, applied to whatever the method uploads: float tensors that
the broadcast also holds are treated as an update ``Δ = upload − broadcast``,
other float tensors as values. The update poisons leave BatchNorm statistics
honest, as a careful attacker would (``bn_var`` is the one that does not).

==============  ==============================================================
``sign_flip``   ``broadcast − scale·Δ`` (the reversed update, ``scale`` 10)
``scale``       ``broadcast + scale·Δ`` (a boosted update; e.g. ``scale: 1e30``)
``max``         every float value at the dtype's largest finite value
``nan``         every float value NaN (refused by any finite check)
``bn_var``      every BatchNorm ``running_var`` at −1e6 (a valid-looking model)
``num_samples`` ``meta.num_samples`` = 10¹⁸ (claims the weight of the federation)
``random``      ``broadcast + N(0, σ²)`` with the honest update's norm (noise)
==============  ==============================================================

The faults below are what a fuzzer of the receive path finds: bytes no honest
serialiser writes, crafted by hand (:class:`CraftedUpload`). Each must end as
that client's refusal, the round going on with the others.

================  ============================================================
``nested_meta``   the honest upload with its metadata nested 1,000 levels deep
                  (about 2 KB; ``json.loads`` would recurse past Python's limit)
``oversize``      the honest upload padded past any size limit the server sets
``garbage``       random bytes the upload's length (not a safetensors message)
``truncated``     the honest upload cut in half
================  ============================================================

The wrapper (:class:`ByzantineMethod`) is covert: the method's public
hyper-parameters do not change; the run's record says who was poisoned.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import save as st_save

from osfl.config import options_config
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import Method, MethodWrapper
from osfl.fl.upload import META_KEY, Broadcast, Upload
from osfl.registry import Registry

Tensors = dict[str, torch.Tensor]
Poison = Callable[[Upload, Broadcast, "ByzantineConfig", torch.Generator], Upload]
POISONS: Registry[Poison] = Registry("poison")


#: How the poisoned clients are chosen: the listed ids, or by their data sizes
#: (on a skewed split the largest clients carry most of a FedAvg weight).
PICKS = ("ids", "largest", "smallest")


@dataclass(frozen=True)
class ByzantineConfig:
    """``clients``: the client ids that send poison (``pick: ids``), or
    ``pick: largest`` / ``smallest`` with ``count``: the ``count`` clients
    with the most / fewest samples, chosen per seed from its federation (ties
    by id); ``kind``: a registered poison (:data:`POISONS`); ``scale``: its
    factor where it has one."""

    clients: list[int] = field(default_factory=list)
    kind: str = "sign_flip"
    scale: float = 10.0
    pick: str = "ids"
    count: int = 1

    def __post_init__(self) -> None:
        POISONS.get(self.kind)  # unknown name -> ConfigError listing the valid ones
        if self.pick not in PICKS:
            raise ConfigError(
                f"byzantine.pick must be one of {', '.join(PICKS)}, got {self.pick!r}"
            )
        if self.pick != "ids" and (
            self.clients or not (type(self.count) is int and self.count >= 1)
        ):
            raise ConfigError(
                f"byzantine.pick={self.pick} chooses the clients itself: give byzantine.count "
                f">= 1 (got {self.count!r}) and no byzantine.clients (got {self.clients})"
            )
        if not all(type(c) is int and c >= 0 for c in self.clients):
            raise ConfigError(f"byzantine.clients must be client ids >= 0, got {self.clients}")
        if len(set(self.clients)) != len(self.clients):
            raise ConfigError(f"byzantine.clients names a client twice: {self.clients}")
        if not (isinstance(self.scale, int | float) and math.isfinite(self.scale)):
            raise ConfigError(f"byzantine.scale must be a finite number, got {self.scale!r}")

    def resolved(self, sizes: Sequence[int]) -> ByzantineConfig:
        """This config with ``clients`` chosen from the clients' data
        ``sizes`` (``pick: largest`` / ``smallest``), as ``pick: ids``."""
        if self.pick == "ids":
            return self
        self.check_clients(len(sizes))
        order = sorted(range(len(sizes)), key=lambda c: (sizes[c], c))
        chosen = order[-self.count :] if self.pick == "largest" else order[: self.count]
        return dataclasses.replace(self, clients=sorted(chosen), pick="ids")

    def check_clients(self, num_clients: int) -> None:
        """Every named client exists (a typo would run with no attacker)."""
        if self.pick != "ids" and self.count > num_clients:
            raise ConfigError(
                f"byzantine.count={self.count} exceeds the run's {num_clients} clients"
            )
        outside = [c for c in self.clients if c >= num_clients]
        if outside:
            raise ConfigError(
                f"byzantine.clients {outside} do not exist: the run has {num_clients} clients "
                f"(ids 0..{num_clients - 1})"
            )


#: BatchNorm statistics a careful attacker leaves honest (a negative variance is refused).
_BN_BUFFERS = ("running_mean", "running_var")


def _floats(upload: Upload, broadcast: Broadcast) -> tuple[list[str], list[str]]:
    """(keys with a same-shaped broadcast counterpart: updates, other float keys:
    values), BatchNorm statistics left out."""
    deltas, values = [], []
    for k, v in upload.tensors.items():
        if not v.is_floating_point() or k.endswith(_BN_BUFFERS):
            continue
        b = broadcast.tensors.get(k)
        (deltas if b is not None and b.shape == v.shape else values).append(k)
    return deltas, values


def _with(upload: Upload, tensors: Mapping[str, torch.Tensor], **meta: Any) -> Upload:
    return Upload(tensors={**upload.tensors, **tensors}, meta={**upload.meta, **meta})


def _affine(upload: Upload, broadcast: Broadcast, factor: float) -> Upload:
    """Updates scaled by ``factor`` around the broadcast; values by ``factor``."""
    deltas, values = _floats(upload, broadcast)
    out: Tensors = {}
    for k in deltas:
        b = broadcast.tensors[k].to(torch.float64)
        u = upload.tensors[k].to(torch.float64)
        out[k] = _finite_cast(b + factor * (u - b), upload.tensors[k].dtype)
    for k in values:
        out[k] = _finite_cast(factor * upload.tensors[k].to(torch.float64), upload.tensors[k].dtype)
    return _with(upload, out)


def _finite_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``, saturated at its largest finite value (a poisoned
    client sends finite numbers: an Inf would be refused at once)."""
    big = torch.finfo(dtype).max
    return x.clamp(-big, big).to(dtype)


@POISONS.register("sign_flip")
def _sign_flip(upload, broadcast, cfg, gen) -> Upload:
    return _affine(upload, broadcast, -abs(cfg.scale))


@POISONS.register("scale")
def _scale(upload, broadcast, cfg, gen) -> Upload:
    return _affine(upload, broadcast, cfg.scale)


@POISONS.register("max")
def _max(upload, broadcast, cfg, gen) -> Upload:
    out = {
        k: torch.full_like(v, torch.finfo(v.dtype).max)
        for k, v in upload.tensors.items()
        if v.is_floating_point()
    }
    return _with(upload, out)


@POISONS.register("nan")
def _nan(upload, broadcast, cfg, gen) -> Upload:
    out = {
        k: torch.full_like(v, math.nan) for k, v in upload.tensors.items() if v.is_floating_point()
    }
    return _with(upload, out)


@POISONS.register("bn_var")
def _bn_var(upload, broadcast, cfg, gen) -> Upload:
    out = {
        k: torch.full_like(v, -1e6) for k, v in upload.tensors.items() if k.endswith("running_var")
    }
    return _with(upload, out)


@POISONS.register("num_samples")
def _num_samples(upload, broadcast, cfg, gen) -> Upload:
    return _with(upload, {}, num_samples=10**18)


@POISONS.register("random")
def _random(upload, broadcast, cfg, gen) -> Upload:
    deltas, values = _floats(upload, broadcast)
    keys = deltas + values
    honest = [
        upload.tensors[k].double() - (broadcast.tensors[k].double() if k in deltas else 0)
        for k in keys
    ]
    norm = math.sqrt(sum(float(t.pow(2).sum()) for t in honest)) or 1.0
    noise = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in honest]
    scale = norm / (math.sqrt(sum(float(n.pow(2).sum()) for n in noise)) or 1.0)
    out: Tensors = {}
    for k, n in zip(keys, noise, strict=True):
        base = broadcast.tensors[k].double() if k in deltas else 0.0
        out[k] = _finite_cast(base + scale * n, upload.tensors[k].dtype)
    return _with(upload, out)


@dataclass
class CraftedUpload(Upload):
    """An upload that is already its bytes on the wire: what a hostile client
    writes by hand, which no honest serialiser produces."""

    raw: bytes = b""

    def to_bytes(self) -> bytes:
        return self.raw


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@POISONS.register("nested_meta")
def _nested_meta(upload, broadcast, cfg, gen) -> Upload:
    meta = json.dumps(upload.meta, sort_keys=True)[:-1] + f', "z": {_nested(1000)}}}'
    if not upload.meta:
        meta = f'{{"z": {_nested(1000)}}}'
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in upload.tensors.items()}
    return CraftedUpload(raw=st_save(tensors, metadata={META_KEY: meta}))


@POISONS.register("oversize")
def _oversize(upload, broadcast, cfg, gen) -> Upload:
    honest = upload.to_bytes()
    pad = torch.zeros(max(1 << 20, 2 * len(honest)) // 4, dtype=torch.float32)
    return Upload(tensors={**upload.tensors, "padding": pad}, meta=dict(upload.meta))


@POISONS.register("garbage")
def _garbage(upload, broadcast, cfg, gen) -> Upload:
    n = len(upload.to_bytes())
    noise = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    return CraftedUpload(raw=bytes(noise.numpy()))


@POISONS.register("truncated")
def _truncated(upload, broadcast, cfg, gen) -> Upload:
    honest = upload.to_bytes()
    return CraftedUpload(raw=honest[: max(8, len(honest) // 2)])


class ByzantineMethod(MethodWrapper):
    """``inner`` whose clients in ``config.clients`` send ``config.kind`` poison
    instead of their honest upload (everything else is the inner method's)."""

    def __init__(self, inner: Method, config: ByzantineConfig):
        super().__init__(inner)
        self.byzantine = config

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        upload = self.inner.client_update(ctx, broadcast, data)
        if ctx.client_id not in self.byzantine.clients:
            return upload
        gen = torch.Generator().manual_seed(ctx.seed_for("byzantine"))
        return POISONS.get(self.byzantine.kind)(upload, broadcast, self.byzantine, gen)


def byzantine_config(spec: Mapping[str, Any] | ByzantineConfig | None) -> ByzantineConfig | None:
    """The config's ``byzantine`` mapping as a :class:`ByzantineConfig` (``None``
    when empty); unknown options are a ConfigError listing the valid ones."""
    if spec is None or isinstance(spec, ByzantineConfig):
        return spec
    if not spec:
        return None
    opts = dict(spec)
    if "clients" in opts:
        opts["clients"] = _client_ids(opts["clients"])
    return options_config(ByzantineConfig, opts, "byzantine")


def _client_ids(raw: Any) -> list[int]:
    """``byzantine.clients`` as ints (YAML may give strings of digits)."""
    items = raw if isinstance(raw, list | tuple) else [raw]
    out = []
    for c in items:
        if isinstance(c, bool) or not (isinstance(c, int) or (isinstance(c, str) and c.isdigit())):
            raise ConfigError(
                f"byzantine.clients must list client ids (integers >= 0), got {list(items)}"
            )
        out.append(int(c))
    return out


def apply_byzantine(
    method: Method,
    spec: Mapping[str, Any] | ByzantineConfig | None,
    sizes: Sequence[int] | None = None,
) -> Method:
    """``method`` wrapped in :class:`ByzantineMethod` when ``spec`` names
    clients (or picks them from the clients' data ``sizes``)."""
    cfg = byzantine_config(spec)
    if cfg is not None and cfg.pick != "ids":
        if sizes is None:
            raise ConfigError(
                f"byzantine.pick={cfg.pick} needs the clients' data sizes: a simulation or "
                "rehearsal; at real sites name byzantine.clients"
            )
        cfg = cfg.resolved(sizes)
    return ByzantineMethod(method, cfg) if cfg is not None and cfg.clients else method


def poisoned_by(method: Method) -> ByzantineConfig | None:
    """The resolved poison of a wrapped method (what its record states)."""
    layer: Method | None = method
    while isinstance(layer, MethodWrapper):
        if isinstance(layer, ByzantineMethod):
            return layer.byzantine
        layer = layer.inner
    return None
