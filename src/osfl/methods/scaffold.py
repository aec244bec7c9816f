"""SCAFFOLD [Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, Alg. 1]: control variates correct client drift.

The server broadcasts ``x`` and ``c``; client ``i`` keeps ``c_i``. Local steps
``y <- y - eta (g_i(y) - c_i + c)``; then ``c_i+ = g_i(x)`` (option I) or
``c_i+ = c_i - c + (x - y)/(K eta)`` (option II); the client uploads ``y``
and ``Delta c_i = c_i+ - c_i``. Server: ``x <- x + eta_g (avg(y) - x)``,
``c <- c + (1/N) sum_S Delta c_i``. See :mod:`osfl.methods.schemes` and
docs/methods/schemes.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.fl.objectives import ScaffoldCorrection
from osfl.methods.clients import StateDict, combine_states, model_from_state
from osfl.methods.schemes import (
    Named,
    SchemeConfig,
    StatefulScheme,
    add_scaled,
    full_gradient,
)
from osfl.registry import Registry

ControlUpdate = Callable[..., StateDict | None]
#: SCAFFOLD's control-variate update (Alg. 1 l. 12): option name -> function
CONTROL_UPDATES: Registry[ControlUpdate] = Registry("SCAFFOLD control-variate option")


@CONTROL_UPDATES.register("i")
def _option_i(method: Scaffold, ctx, term, c, c_i, global_state, model, data) -> StateDict:
    x = model_from_state(method.run, global_state)
    cfg = method.run.train
    return full_gradient(
        x,
        data,
        cfg,
        transform=method.run.train_transform,
        device=method.run.device,
        generator=ctx.generator,
    )


@CONTROL_UPDATES.register("ii")
def _option_ii(method: Scaffold, ctx, term, c, c_i, global_state, model, data) -> StateDict:
    names = method.param_names()
    x = {k: global_state[k] for k in names}
    y = {k: v for k, v in model.named_parameters() if k in x}
    return ScaffoldCorrection.option_ii(c, c_i, x, {k: y[k].to("cpu") for k in names}, term.lr_sum)


@CONTROL_UPDATES.register("none")
def _option_none(method: Scaffold, ctx, term, c, c_i, global_state, model, data) -> None:
    return None  # c_i never changes (stays zero): FedAvg with the same weighting


@dataclass(frozen=True)
class ScaffoldConfig(SchemeConfig):
    """``option``: the control-variate update, ``"II"`` (the paper's cheaper
    choice, used in its experiments), ``"I"`` or ``"none"`` (no update: FedAvg).
    ``server_lr``: the global step ``eta_g`` (1 in the paper's experiments)."""

    #: control-variate update: II (the paper's experiments), I, or none (FedAvg)
    option: str = "II"
    #: the server's global step size
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        CONTROL_UPDATES.get(self.option)
        if not self.server_lr > 0:
            raise ConfigError(f"server_lr must be > 0, got {self.server_lr}")


@register_method("scaffold")
class Scaffold(StatefulScheme):
    """SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct client drift."""

    Config: ClassVar[type] = ScaffoldConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        StatefulScheme.card,
        summary=(
            "FedAvg with control variates that correct the drift of each client's local steps."
        ),
        paper=(
            'Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated '
            'Learning", ICML 2020'
        ),
        default_order=21,
        smoke=("method.scaffold.rounds=2",),
    )
    prefix: ClassVar[str] = "scaffold"
    server_names: ClassVar[tuple[str, ...]] = ("c",)

    def upload_names(self) -> tuple[str, ...]:
        return () if self.config.option.lower() == "none" else ("delta_c",)

    def local_round(self, ctx, model, global_state, shared, memory, data) -> Named:
        c, c_i = shared.get("c"), memory.get("c_i")
        term = ScaffoldCorrection(c, c_i)
        self.train(ctx, model, data, (term,))
        update = CONTROL_UPDATES.get(self.config.option)
        new_ci = update(self, ctx, term, c, c_i, global_state, model, data)
        if new_ci is None:
            return {}
        memory["c_i"] = new_ci
        return {"delta_c": new_ci if c_i is None else add_scaled(new_ci, c_i, -1.0)}

    def update_server(self, old, new, parts, weights, counts, round) -> None:
        clients = list(parts)
        avg = combine_states(
            self.run, [parts[c][0] for c in clients], weights, old.model, round=round
        )
        eta_g = self.config.server_lr
        if eta_g != 1.0:
            avg = {
                k: (old.model[k] + eta_g * (v - old.model[k])) if v.is_floating_point() else v
                for k, v in avg.items()
            }
        new.model = avg
        n = self.run.num_clients
        for c in clients:
            dc = parts[c][1].get("delta_c")
            if dc is None:
                continue
            new.server["c"] = add_scaled(new.server["c"], dc, 1.0 / n)
            new.clients.setdefault(c, {})["c_i"] = add_scaled(new.clients.get(c, {}).get("c_i"), dc)

    def audit_history(self, state, client, upload_meta=None) -> dict[str, torch.Tensor]:
        known = state.clients.get(client, {}).get("c_i") or self.zeros(state.model)
        return self._history({"c": state.server["c"], "c_i": known})
