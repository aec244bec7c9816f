"""Secure aggregation's Flower-free part: the knobs (:class:`SecAggPlusConfig`),
which methods can run under it (:func:`secure_refusal`, :data:`SECURE_WEIGHTINGS`),
the tensor layout the clients sum (:func:`layout_of`) and each round's
quantisation (:func:`plan_round`). It imports no ``flwr``, so that
``osfl.config`` can hold a :class:`SecAggPlusConfig`; the protocol itself runs
in :mod:`osfl.flower.secagg_client` and
:mod:`osfl.flower.secagg_server`.

SecAgg+: Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead", ACM CCS 2020 (Algorithm 2, on
Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", ACM CCS 2017, Fig. 4). The server learns the sum of the clients'
quantised vectors, never a vector.

Precision (Flower 1.41, ``flwr/common/secure_aggregation/quantization.py``):
client ``i`` sends ``v_i = (n_i / m) * w / s`` clipped to ``[-c, c]`` and
stochastically rounded to a grid of step ``2c / Q`` (error below one step);
the server divides the sum by ``sum_i n_i / m`` and multiplies by ``s``. With
``m`` a power of two (exact weights), ``s`` a power of two per tensor (1 for
floats; larger for integer counters such as BatchNorm's
``num_batches_tracked``, whose mean is rounded anyway) and nothing clipped,
each coordinate of the mean is within ``s * 2 k c m / (Q N)`` of the exact
weighted mean (:meth:`QuantizationPlan.error`; ``k`` clients, ``N = sum_i
n_i``) before the cast to its dtype.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from osfl import jsonio
from osfl.errors import ConfigError, UploadError
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import Upload, UploadSpec
from osfl.registry import Registry

__all__ = [
    "BROADCAST_TENSOR_TYPE",
    "MODULUS_BITS",
    "SECURE_AGGREGATE",
    "SECURE_WEIGHTINGS",
    "Layout",
    "QuantizationPlan",
    "SecAggPlusConfig",
    "SecureKey",
    "SecureWeighting",
    "layout_digest",
    "layout_of",
    "plan_round",
    "secure_refusal",
]

#: The key of the round's one upload that ``Method.aggregate`` receives under
#: secure aggregation: the clients' weighted mean, no client's upload.
SECURE_AGGREGATE = -1
#: Flower's largest mask modulus (``SecAggPlusWorkflow``: at most 2**32).
MODULUS_BITS = 32

#: Tensor name -> (shape, dtype), sorted by name: what every client of a round sums.
Layout = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


class SecureKey:
    """The clear-text envelope of a SecAgg+ round, as both sides name it: the
    keys of the ``FitIns.config`` the server sends and of the ``FitRes.metrics``
    a client returns next to its masked vector."""

    ROUND = "round"
    CLIENT = "client"
    JOB = "job"  # the job digest both sides built
    PLAN = "quantization"  # FitIns: the round's QuantizationPlan (JSON)
    LAYOUT = "layout"  # FitRes: layout_digest of the summed tensors
    NOTES = "notes"  # FitRes: the client's training warnings (JSON list)


#: ``Parameters.tensor_type`` of the broadcast (its safetensors bytes) in a FitIns.
BROADCAST_TENSOR_TYPE = "osfl.safetensors"


# --------------------------------------------------------------------------- the knobs
@dataclass(frozen=True)
class SecAggPlusConfig:
    """SecAgg+'s knobs (Flower's ``SecAggPlusWorkflow`` arguments).

    ``enabled``: the Flower runtimes run the rounds under SecAgg+
    (:func:`~osfl.flower.secagg_server.execute_secure`); the other
    knobs only matter then. ``share_fraction``: each client's neighbourhood as
    a fraction of the round's clients (1.0: all of them, i.e. SecAgg).
    ``threshold_fraction``: the shares that reconstruct a secret, as a
    fraction of the neighbourhood (Flower rounds it, at least 2): higher
    resists more colluders, lower tolerates more dropouts. ``clipping_range``
    (``c``): every weighted value ``(n_i / max_weight) * w`` must lie in
    ``[-c, c]`` (Flower's default 8 is too tight for BatchNorm running
    variances). ``quantization_bits`` (``Q = 2**bits``; ``None``: the most the
    round's client count allows under the 2**32 modulus, 30 for 3 clients;
    Flower's default is 22). ``max_weight`` (``m``): a power of two >= every
    ``num_samples`` (``None``: the smallest one >= the largest count the
    server accepts from the round's clients: their partition sizes in a
    rehearsal, else ``server.max_num_samples``, whose default makes ``m``
    huge and the mean coarse: set it for real sites).
    """

    enabled: bool = False
    share_fraction: float = 1.0
    threshold_fraction: float = 0.67
    clipping_range: float = 32.0
    quantization_bits: int | None = None
    max_weight: int | None = None

    def __post_init__(self) -> None:
        problems = [
            f"{name} must lie in (0, 1], got {v}"
            for name, v in (
                ("share_fraction", self.share_fraction),
                ("threshold_fraction", self.threshold_fraction),
            )
            if not 0.0 < v <= 1.0
        ]
        if not self.clipping_range > 0.0:
            problems.append(f"clipping_range must be > 0, got {self.clipping_range}")
        if self.quantization_bits is not None and not 1 <= self.quantization_bits < MODULUS_BITS:
            problems.append(f"quantization_bits must lie in [1, 31], got {self.quantization_bits}")
        if self.max_weight is not None and not _is_power_of_two(self.max_weight):
            problems.append(f"max_weight must be a power of two, got {self.max_weight}")
        if problems:
            raise ConfigError("secagg: " + "; ".join(problems))


def _is_power_of_two(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


# --------------------------------------------------------------------------- which methods
@dataclass(frozen=True)
class SecureWeighting:
    """How a method weights the uploads in its mean, as SecAgg+ needs it: each
    client's integer weight from its own upload (Flower's ``num_examples``),
    and the largest weight from the largest ``num_samples`` the server accepts
    from that client. The names are those of ``osfl.methods.clients.WEIGHTINGS``."""

    weight: Callable[[Upload], Any]
    bound: Callable[[int], int]


SECURE_WEIGHTINGS: Registry[SecureWeighting] = Registry("secure weighting")
SECURE_WEIGHTINGS.add("data_size", SecureWeighting(lambda up: up.meta.get("num_samples"), int))
SECURE_WEIGHTINGS.add("uniform", SecureWeighting(lambda up: 1, lambda n: 1))


def secure_refusal(method_name: str, weighting: str | None, server: ServerConfig) -> str | None:
    """Why a run cannot use secure aggregation (``None``: it can).

    ``weighting``: the method's declaration (``SecureAggregation.secure_weighting``) that
    its ``aggregate`` needs only the mean of the uploads' tensors weighted by
    this :data:`SECURE_WEIGHTINGS` rule, and gives the same state from that
    mean alone (one upload keyed :data:`SECURE_AGGREGATE`); ``None``: it
    needs individual uploads. The server's robust rules, member filters and
    update-norm bound read individual uploads too."""
    if weighting is None:
        return (
            f"method {method_name!r} needs the clients' individual uploads (client models for "
            "an ensemble or distillation, per-client server state or tensor sets), which "
            "SecAgg+ hides from the server by design; run it without secure aggregation"
        )
    SECURE_WEIGHTINGS.get(weighting)  # unknown -> ConfigError listing the valid ones
    if server.aggregator != "mean":
        return (
            f"server.aggregator={server.aggregator!r} combines individual uploads, but under "
            "SecAgg+ the server sees only their weighted mean: use server.aggregator=mean"
        )
    if server.member_filter != "none":
        return (
            f"server.member_filter={server.member_filter!r} screens individual uploads, "
            "which SecAgg+ hides: use server.member_filter=none"
        )
    if server.max_update_norm is not None:
        return (
            f"server.max_update_norm={server.max_update_norm} bounds each client's update, "
            "which SecAgg+ hides from the server: leave it null (a client-side bound is the "
            "'defense' wrapper's clip)"
        )
    return None


# --------------------------------------------------------------------------- the layout
def layout_of(specs: Mapping[int, UploadSpec]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The one layout (name -> shape, dtype; sorted) the round's clients sum,
    from their upload specs; what SecAgg+ cannot sum is a ConfigError."""
    layouts = set()
    for c, spec in specs.items():
        if spec.optional or spec.allow_extra or spec.variants or "num_samples" not in spec.meta:
            raise ConfigError(
                f"client {c}'s upload spec is not a fixed set of tensors with num_samples; "
                "SecAgg+ sums one fixed layout"
            )
        items = []
        for name, t in sorted(spec.tensors.items()):
            if t.shape is None or t.dtype is None or not all(isinstance(d, int) for d in t.shape):
                raise ConfigError(f"tensor {name!r} has no fixed shape and dtype for SecAgg+")
            items.append((name, tuple(int(d) for d in t.shape), t.dtype))  # type: ignore[arg-type]
        layouts.add(tuple(items))
    if len(layouts) != 1:
        raise ConfigError("the round's clients upload different tensor sets; SecAgg+ sums one")
    return {name: (shape, dtype) for name, shape, dtype in layouts.pop()}


def layout_digest(layout: Layout) -> str:
    """A digest of a layout, sent in clear next to the masked vector (which
    carries no names) and compared by the server."""
    text = json.dumps([[n, list(s), str(d)] for n, (s, d) in sorted(layout.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- the round's plan
@dataclass(frozen=True)
class QuantizationPlan:
    """One round's quantisation, fixed by the server before the round and sent
    to every client of it (so that a client can refuse what would be clipped)."""

    weighting: str
    clients: int
    clipping_range: float
    quantization_bits: int
    max_weight: int
    scales: dict[str, float]  # per tensor, sorted by name: the divisor s (a power of two)

    def error(self, total_weight: int) -> float:
        """The bound on a coordinate's error (before ``* s``) of the mean of
        ``clients`` clients of total weight ``N``: ``2 k c m / (Q N)``."""
        step = 2.0 * self.clipping_range / 2**self.quantization_bits
        return self.clients * step * self.max_weight / total_weight

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: Any, *, client: int) -> QuantizationPlan:
        """The plan a client received; anything malformed is an UploadError
        (the client drops out rather than quantise with a broken plan)."""
        try:
            raw = jsonio.loads(str(text), max_depth=4, max_chars=1 << 20)
            plan = cls(
                weighting=str(raw["weighting"]),
                clients=int(raw["clients"]),
                clipping_range=float(raw["clipping_range"]),
                quantization_bits=int(raw["quantization_bits"]),
                max_weight=int(raw["max_weight"]),
                scales={str(n): float(v) for n, v in dict(raw["scales"]).items()},
            )
            SECURE_WEIGHTINGS.get(plan.weighting)
        except (ValueError, TypeError, KeyError, ConfigError) as e:
            raise UploadError(
                f"the FitIns holds no valid quantisation plan: {e}", client=client
            ) from e
        if not _is_power_of_two(plan.max_weight) or plan.max_weight > 2**plan.quantization_bits:
            raise UploadError(f"max_weight {plan.max_weight} is not usable", client=client)
        return plan


def plan_round(
    config: SecAggPlusConfig, layout: Layout, bounds: Mapping[int, int], weighting: str
) -> QuantizationPlan:
    """The round's plan (``bounds``: client -> the largest ``num_samples`` the
    server accepts from it): the finest grid the modulus allows (``k Q <
    2**32``: the sum of ``k`` quantised vectors must not wrap), exact weights
    (``m`` a power of two), and for every integer tensor the largest
    power-of-two divisor whose error stays below 1/8 when the clients weigh
    what the server allows them (capped at ``m``, above which a client drops
    out); lighter clients make the error grow by the ratio of the weights."""
    k = len(bounds)
    bits = config.quantization_bits or MODULUS_BITS - k.bit_length()
    if bits < 1 or k >= 2 ** (MODULUS_BITS - bits):
        raise ConfigError(
            f"secagg: {k} clients in a round overflow the 2**32 modulus with "
            f"quantization_bits={bits}; lower it or sample fewer clients per round"
        )
    most = {c: SECURE_WEIGHTINGS.get(weighting).bound(b) for c, b in bounds.items()}
    largest = max(most.values())
    m = config.max_weight or 1 << max(0, (largest - 1).bit_length())
    if m > 2**bits:
        raise ConfigError(
            f"secagg: max_weight {m} (clients may weigh up to {largest}) exceeds "
            "2**quantization_bits; set secagg.max_weight and server.max_num_samples lower"
        )
    plan = QuantizationPlan(weighting, k, config.clipping_range, bits, m, {})
    unit = plan.error(sum(min(w, m) for w in most.values()))
    int_scale = float(2 ** max(0, int(np.floor(np.log2(1.0 / (8.0 * unit))))))
    scales = {n: 1.0 if dtype.is_floating_point else int_scale for n, (_, dtype) in layout.items()}
    return dataclasses.replace(plan, scales=scales)
