"""Server optimisers: how a server turns the round's combined client state into
the next global state (Reddi et al., "Adaptive Federated Optimization", ICLR
2021, Algorithm 2).

The round's clients start from the global state ``x``; the server combines
their states with its rule (``server.aggregator``: the weighted mean, or a
Byzantine-robust rule, :mod:`osfl.fl.aggregators`) into ``c``, and the
pseudo-gradient is ``Δ = c − x`` (for the mean, ``Σ_i w_i (x_i − x)``). Each
registered optimiser maps ``(x, Δ, slots)`` to the next ``x`` and its new
slots (the moments it keeps between rounds, part of the server's state):

- ``fedavg``: ``x ← x + η Δ`` (``η = 1``: the combined state itself).
- ``fedadam``: ``m ← β₁ m + (1 − β₁) Δ``, ``v ← β₂ v + (1 − β₂) Δ²``,
  ``x ← x + η m / (√v + τ)``, with ``m = v = 0`` before the first round and
  no bias correction, as Reddi et al. write it and as FENS's public code
  runs it (``sacs-epfl/fens`` a349903, ``distoptim/FedAdam.py`` lines 88–103;
  its ``β₂ = 0.99`` and ``τ = 1e-3`` at lines 19–20).

Only floating tensors move by the rule; integer buffers (BatchNorm's
``num_batches_tracked``) take the combined value. The arithmetic is float64
and the result is cast back to each tensor's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from osfl.errors import ConfigError
from osfl.registry import Registry

__all__ = ["SERVER_OPTIMIZERS", "ServerOptConfig", "server_step"]

StateDict = dict[str, torch.Tensor]
Slots = dict[str, StateDict]


@dataclass(frozen=True)
class ServerOptConfig:
    """``optimizer``: a name in :data:`SERVER_OPTIMIZERS` (``fedavg``,
    ``fedadam``); ``lr``: the server step ``η``; ``beta1``, ``beta2``, ``tau``:
    FedAdam's moment decays and adaptivity (unused by ``fedavg``)."""

    #: the server's step: fedavg or fedadam
    optimizer: str = "fedavg"
    #: the server's learning rate
    lr: float = 1.0
    #: FedAdam's first-moment decay
    beta1: float = 0.9
    #: FedAdam's second-moment decay
    beta2: float = 0.99
    #: FedAdam's adaptivity
    tau: float = 1e-3

    def __post_init__(self) -> None:
        SERVER_OPTIMIZERS.get(self.optimizer)  # unknown name -> ConfigError listing the valid ones
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"server optimiser: lr must be > 0, got {self.lr}")
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not 0.0 <= b < 1.0:
                raise ConfigError(f"server optimiser: {name} must lie in [0, 1), got {b}")
        if not self.tau > 0:
            raise ConfigError(f"server optimiser: tau must be > 0, got {self.tau}")


#: ``step(x, delta, slots, cfg) -> (new float64 values of x, new slots)``,
#: over the floating tensors of ``x`` only.
ServerRule = Callable[[StateDict, StateDict, Slots, ServerOptConfig], tuple[StateDict, Slots]]
SERVER_OPTIMIZERS: Registry[ServerRule] = Registry("server optimiser")


@SERVER_OPTIMIZERS.register("fedavg")
def _fedavg(x: StateDict, delta: StateDict, slots: Slots, cfg: ServerOptConfig):
    return {k: x[k] + cfg.lr * d for k, d in delta.items()}, {}


@SERVER_OPTIMIZERS.register("fedadam")
def _fedadam(x: StateDict, delta: StateDict, slots: Slots, cfg: ServerOptConfig):
    m_old, v_old = slots.get("m", {}), slots.get("v", {})
    m, v, out = {}, {}, {}
    for k, d in delta.items():
        m[k] = cfg.beta1 * m_old.get(k, torch.zeros_like(d)) + (1 - cfg.beta1) * d
        v[k] = cfg.beta2 * v_old.get(k, torch.zeros_like(d)) + (1 - cfg.beta2) * d * d
        out[k] = x[k] + cfg.lr * m[k] / (v[k].sqrt() + cfg.tau)
    return out, {"m": m, "v": v}


def server_step(
    cfg: ServerOptConfig,
    x: Mapping[str, torch.Tensor],
    combined: Mapping[str, torch.Tensor],
    slots: Slots | None = None,
) -> tuple[StateDict, Slots]:
    """The next global state from ``x`` and the round's ``combined`` state,
    with the optimiser's ``slots`` from the rounds before (``None`` or empty
    before the first). Returns ``(state, slots)``."""
    floats = [k for k, v in x.items() if v.is_floating_point()]
    x64 = {k: x[k].to(torch.float64) for k in floats}
    delta = {k: combined[k].to(torch.float64) - x64[k] for k in floats}
    stepped, new_slots = SERVER_OPTIMIZERS.get(cfg.optimizer)(x64, delta, slots or {}, cfg)
    state = {
        k: stepped[k].to(v.dtype) if k in stepped else combined[k].clone() for k, v in x.items()
    }
    return state, new_slots
