"""FedDyn [Acar et al., "Federated Learning Based on Dynamic Regularization",
ICLR 2021, Alg. 1]: a dynamic regulariser aligns local and global optima.

Client ``k`` keeps ``g_k = grad L_k(theta_k^{t-1})``; local objective
``L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||²``; then
``g_k <- g_k - alpha (theta_k^t - theta^{t-1})``; uploads ``theta_k^t``.
Server: ``h <- h - (alpha/N) sum_S (theta_k^t - theta^{t-1})``,
``theta^t = avg(theta_k^t) - h/alpha``. See :mod:`osfl.methods.schemes`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.fl.objectives import FedDynTerm
from osfl.methods.clients import combine_states
from osfl.methods.schemes import (
    Named,
    SchemeConfig,
    SchemeState,
    StatefulScheme,
    add_scaled,
    delta_of,
)


@dataclass(frozen=True)
class FedDynConfig(SchemeConfig):
    """``alpha``: the dynamic-regulariser weight; 0.01 is the authors' code
    default (the paper searches {0.1, 0.01, 0.001}). ``alpha = 0`` is FedAvg."""

    #: weight of the dynamic regulariser (0: FedAvg)
    alpha: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.alpha >= 0.0:
            raise ConfigError(f"alpha must be >= 0, got {self.alpha}")


@register_method("feddyn")
class FedDyn(StatefulScheme):
    """FedDyn (Acar et al., ICLR 2021): a dynamic regulariser aligns local and global optima."""

    Config: ClassVar[type] = FedDynConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        StatefulScheme.card,
        summary=(
            "FedAvg with a dynamic regulariser that aligns each client's optimum with the global "
            "one."
        ),
        paper='Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021',
        default_order=22,
        smoke=("method.feddyn.rounds=2",),
    )
    prefix: ClassVar[str] = "feddyn"

    def local_round(self, ctx, model, global_state, shared, memory, data) -> Named:
        alpha = self.config.alpha
        anchor = {k: global_state[k] for k in self.param_names()}
        term = FedDynTerm(anchor, memory.get("grad"), alpha)
        self.train(ctx, model, data, (term,))
        if alpha > 0:
            memory["grad"] = term.next_grad_state(model)
        return {}

    def update_server(self, old, new, parts, weights, counts, round) -> None:
        clients = list(parts)
        avg = combine_states(
            self.run, [parts[c][0] for c in clients], weights, old.model, round=round
        )
        alpha = self.config.alpha
        if alpha > 0:
            names = self.param_names()
            n = self.run.num_clients
            h = old.server.get("h") or self.zeros(old.model)
            for c in clients:
                delta = delta_of(parts[c][0], old.model, names)
                h = add_scaled(h, delta, -alpha / n)
                known = new.clients.setdefault(c, {})
                known["grad"] = add_scaled(known.get("grad"), delta, -alpha)
            new.server["h"] = h
            for k in names:
                avg[k] = (avg[k].to(torch.float32) - h[k] / alpha).to(avg[k].dtype)
        new.model = avg

    def init_state(self) -> SchemeState:
        state = super().init_state()
        state.server["h"] = self.zeros(state.model)
        return state

    def audit_history(self, state, client, upload_meta=None) -> dict[str, torch.Tensor]:
        known = state.clients.get(client, {}).get("grad") or self.zeros(state.model)
        return self._history({"grad": known})
