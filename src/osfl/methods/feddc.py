"""FedDC [Gao et al., "FedDC: Federated Learning with Non-IID Data via Local
Drift Decoupling and Correction", CVPR 2022; equations as in Chen & Vikalo,
ICML 2024, Eq. 81-82].

Client ``k`` keeps its drift ``d_k`` and its last local update; local
objective ``L_k(theta) + alpha/2 ||theta + d_k - w||² + <theta, (Delta
theta_k^{t-1} - Delta Theta^{t-1})/(eta K)>``; then ``d_k <- d_k + (theta_k -
w)``; uploads ``theta_k``. Server: ``w <- avg(theta_k + d_k)``, ``Delta Theta
<- avg(theta_k - w)`` (broadcast next round). See :mod:`osfl.methods.schemes`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.fl.objectives import FedDCTerm, effective_lr_sum
from osfl.fl.optim import OPTIMIZERS, lr_at
from osfl.methods.clients import StateDict, combine_states
from osfl.methods.schemes import Named, SchemeConfig, StatefulScheme, add_scaled, delta_of


@dataclass(frozen=True)
class FedDCConfig(SchemeConfig):
    """``alpha``: the drift-penalty weight (0.01, the authors' code default for
    CIFAR-10). ``drift`` / ``correction`` switch off the drift variable and the
    gradient correction (the paper's ablations); ``alpha = 0`` with both off is
    FedAvg."""

    #: weight of the drift penalty
    alpha: float = 0.01
    #: keep and apply each client's drift variable (false: an ablation)
    drift: bool = True
    #: apply the gradient correction (false: an ablation)
    correction: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.alpha >= 0.0:
            raise ConfigError(f"alpha must be >= 0, got {self.alpha}")


@register_method("feddc")
class FedDC(StatefulScheme):
    """FedDC (Gao et al., CVPR 2022): local drift decoupling and gradient correction."""

    Config: ClassVar[type] = FedDCConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        StatefulScheme.card,
        summary="FedAvg whose clients track their drift from the global model and correct for it.",
        paper=(
            'Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling '
            'and Correction", CVPR 2022'
        ),
        default_order=23,
        smoke=("method.feddc.rounds=2",),
    )
    prefix: ClassVar[str] = "feddc"
    server_names: ClassVar[tuple[str, ...]] = ("global_update",)

    def lr_steps(self, num_samples: int) -> float:
        """``eta * K``, the scale of the gradient correction, for a client of
        ``num_samples`` (:func:`~osfl.fl.objectives.effective_lr_sum` of its
        steps: exactly ``eta * K`` for plain SGD with a constant lr)."""
        cfg = self.run.train
        lrs = lr_at(cfg, cfg.total_steps(num_samples))
        entry = OPTIMIZERS.get(cfg.optimizer)
        momentum = cfg.momentum if entry.uses_momentum else 0.0
        return effective_lr_sum(lrs, momentum, cfg.optimizer == "nesterov")

    def correction(
        self, last: StateDict | None, global_update: StateDict, num_samples: int
    ) -> StateDict:
        """``(Delta theta_k^{t-1} - Delta Theta^{t-1}) / (eta K)`` (a client with no
        previous update has ``Delta theta_k = 0``)."""
        scale = 1.0 / self.lr_steps(num_samples)
        base = (
            {k: -v for k, v in global_update.items()}
            if last is None
            else add_scaled(last, global_update, -1.0)
        )
        return {k: scale * v for k, v in base.items()}

    def local_round(self, ctx, model, global_state, shared, memory, data) -> Named:
        cfg_ = self.config
        drift = memory.get("drift") if cfg_.drift else None
        corr = None
        if cfg_.correction:
            corr = self.correction(memory.get("update"), shared["global_update"], len(data))
        anchor = {k: global_state[k] for k in self.param_names()}
        self.train(ctx, model, data, (FedDCTerm(anchor, drift, corr, cfg_.alpha),))
        delta = delta_of(dict(model.named_parameters()), global_state, self.param_names())
        if cfg_.drift:
            memory["drift"] = add_scaled(drift, delta)
        if cfg_.correction:
            memory["update"] = delta
        return {}

    def update_server(self, old, new, parts, weights, counts, round) -> None:
        clients = list(parts)
        names = self.param_names()
        corrected, deltas = [], []
        for c in clients:
            state = dict(parts[c][0])
            delta = delta_of(state, old.model, names)
            deltas.append(delta)
            known = new.clients.setdefault(c, {})
            if self.config.drift:
                known["drift"] = add_scaled(known.get("drift"), delta)
                for k in names:  # the server aggregates theta_k + d_k
                    state[k] = (state[k].to(torch.float32) + known["drift"][k]).to(state[k].dtype)
            if self.config.correction:
                known["update"] = delta
            corrected.append(state)
        new.model = combine_states(self.run, corrected, weights, old.model, round=round)
        if self.config.correction:
            g = {k: torch.zeros_like(v) for k, v in deltas[0].items()}
            for w, d in zip(weights, deltas, strict=True):
                g = add_scaled(g, d, float(w))
            new.server["global_update"] = g

    def audit_history(self, state, client, upload_meta=None) -> dict[str, torch.Tensor]:
        known = state.clients.get(client, {})
        zeros = self.zeros(state.model)
        named = {"drift": known.get("drift") or zeros}
        n = (upload_meta or {}).get("num_samples")
        if self.config.correction and isinstance(n, int) and n > 0:
            global_update = state.server["global_update"]
            named["correction"] = self.correction(known.get("update"), global_update, n)
            named["global_update"] = global_update
            named["update"] = known.get("update") or zeros
        return self._history(named)
