"""Pluggable terms of a client's local objective.

Many FL algorithms differ from FedAvg only in what a client adds to its local
loss or how it corrects its gradient. The training engine
(:func:`osfl.fl.training.train_local`) calls four hooks of every
:class:`ObjectiveTerm`, so such algorithms plug in without touching the loop:

===================  ===========================================================
hook                 when, and what it is for
===================  ===========================================================
``setup``            once, after the optimizer exists: move server state to the
                     model's device, pair it with the trainable parameters.
``extra_loss``       every step, inside autocast, after the data loss: a tensor
                     added to the loss (or ``None``). FedProx's proximal term
                     ``mu/2 ||w - w_g||²`` [Li et al., MLSys 2020]; FedDyn's
                     ``-<g_k, w> + alpha/2 ||w - w_g||²`` [Acar et al., ICLR 2021];
                     FedDC's drift penalty [Gao et al., CVPR 2022].
``before_step``      after ``backward`` (grads unscaled when AMP is on), before
                     gradient clipping and ``optimizer.step``: correct the
                     gradient in place. SCAFFOLD's control variates
                     ``grad += c - c_i`` [Karimireddy et al., ICML 2020].
``after_step``       after ``optimizer.step`` and the lr schedule: bookkeeping
                     that needs the updated weights (e.g. counting steps for
                     SCAFFOLD's option-II ``c_i`` update at the end).
===================  ===========================================================

``key()`` names the term and its hyper-parameters for the client-training
cache key. State that differs per round (the global weights) is covered by the
cache's hash of the initial model, not by ``key()``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.registry import Registry

OBJECTIVE_TERMS: Registry[type[ObjectiveTerm]] = Registry("objective term")


class ObjectiveTerm:
    """Base class: every hook is a no-op, subclasses override what they need."""

    name: ClassVar[str] = "term"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Called once before the first step."""

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """A scalar added to the step's loss, or ``None`` for nothing."""
        return None

    def before_step(self, model: nn.Module) -> None:
        """Called after ``backward``, before clipping and ``optimizer.step``."""

    def after_step(self, model: nn.Module) -> None:
        """Called after ``optimizer.step`` and the schedule step."""

    def key(self) -> dict[str, Any]:
        """JSON-able identity of this term (name + hyper-parameters) for cache keys."""
        return {"name": self.name}


def _register(name: str):
    def deco(cls: type[ObjectiveTerm]) -> type[ObjectiveTerm]:
        cls.name = name
        OBJECTIVE_TERMS.add(name, cls)
        return cls

    return deco


@_register("proximal")
class ProximalTerm(ObjectiveTerm):
    """FedProx's proximal term ``mu/2 * ||w - w_g||²`` over the trainable parameters.

    Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
    Eq. (2). Its gradient is exactly ``mu * (w - w_g)``. ``global_params`` maps
    parameter names (as in ``model.named_parameters()``) to the global weights;
    buffers (BN statistics) are not parameters and take no part. With
    ``mu == 0`` the term adds nothing, so training equals plain training.
    """

    def __init__(self, global_params: Mapping[str, torch.Tensor] | nn.Module, mu: float):
        if not mu >= 0.0:
            raise ConfigError(f"ProximalTerm mu must be >= 0, got {mu}")
        if isinstance(global_params, nn.Module):
            global_params = dict(global_params.named_parameters())
        self.global_params = {k: v.detach() for k, v in global_params.items()}
        self.mu = float(mu)
        self._params: list[torch.Tensor] = []
        self._anchors: list[torch.Tensor] = []

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        params, anchors = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            g = self.global_params.get(name)
            if g is None:
                raise ConfigError(
                    f"ProximalTerm: the global weights lack parameter {name!r}; "
                    "pass the global model's named_parameters()"
                )
            if g.shape != p.shape:
                raise ConfigError(
                    f"ProximalTerm: parameter {name!r} has shape {tuple(p.shape)} but the "
                    f"global weight has {tuple(g.shape)}"
                )
            params.append(p)
            anchors.append(g.to(device=p.device, dtype=p.dtype))
        self._params, self._anchors = params, anchors

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        if self.mu == 0.0 or not self._params:
            return None
        total = sum(((p - g) ** 2).sum() for p, g in zip(self._params, self._anchors, strict=True))
        return 0.5 * self.mu * total

    def key(self) -> dict[str, Any]:
        return {"name": self.name, "mu": self.mu}


# --------------------------------------------------------------------------- FL schemes
def _paired(
    model: nn.Module, tensors: Mapping[str, torch.Tensor] | None, who: str
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``(parameter, tensor on its device or None)`` for every trainable parameter.

    ``tensors`` maps parameter names to tensors of the same shape; ``None``
    means "all zero" (a client that has no history yet). A mapping that lacks
    a trainable parameter or has the wrong shape is a configuration error:
    the scheme's state was built for another model.
    """
    out: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if tensors is None:
            out.append((p, None))
            continue
        t = tensors.get(name)
        if t is None:
            raise ConfigError(f"{who}: the scheme's state lacks parameter {name!r}")
        if tuple(t.shape) != tuple(p.shape):
            raise ConfigError(
                f"{who}: parameter {name!r} has shape {tuple(p.shape)} but the scheme's "
                f"state has {tuple(t.shape)}"
            )
        out.append((p, t.detach().to(device=p.device, dtype=p.dtype)))
    return out


def _digest(*states: Mapping[str, torch.Tensor] | None) -> str:
    """Content hash of some named tensors (cache keys of per-round scheme state)."""
    h = hashlib.sha256()
    for state in states:
        if state is None:
            h.update(b"none")
            continue
        for k in sorted(state):
            h.update(k.encode())
            h.update(state[k].detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _add_to_grads(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``p.grad += t`` for each pair (a parameter unused by the loss gets ``t``)."""
    for p, t in pairs:
        if p.grad is None:
            p.grad = t.clone()
        else:
            p.grad.add_(t)


def effective_lr_sum(lrs: list[float], momentum: float = 0.0, nesterov: bool = False) -> float:
    """How far ``len(lrs)`` optimizer steps move the weights per unit of a constant gradient.

    Plain SGD moves ``sum(lrs)``: it is the ``K * eta_l`` that turns a local
    displacement into a mean gradient (SCAFFOLD option II, FedDC's correction).
    With PyTorch's heavy-ball momentum (``v <- gamma v + g``, ``w <- w - eta v``)
    the gradient of step ``j`` keeps acting in later steps, with total weight
    ``h_j = sum_{k >= j} eta_k gamma^{k-j}``; Nesterov's step ``g + gamma v``
    gives it ``eta_j + gamma h_j`` (the same weights as RLU's rho, Chen &
    Vikalo 2024, Eqs. 45 and 56). The sum of the weights is returned, so that
    ``(x - y) / effective_lr_sum`` is the (weighted) mean gradient whatever
    the optimizer; for plain SGD with a constant lr it is exactly ``K * eta``.
    """
    total, tail = 0.0, 0.0
    for lr in reversed(lrs):
        tail = lr + momentum * tail
        total += (lr + momentum * tail) if nesterov else tail
    return total


@_register("scaffold")
class ScaffoldCorrection(ObjectiveTerm):
    """SCAFFOLD's corrected local step [Karimireddy et al., ICML 2020, Alg. 1 l. 10]::

        y_i <- y_i - eta_l * (g_i(y_i) - c_i + c)

    ``before_step`` adds ``c - c_i`` to the gradient of every trainable
    parameter, so plain SGD takes exactly the step above and SGD+momentum /
    Nesterov accumulate the corrected gradient (as SCAFFOLD implementations
    with momentum do). It also records the learning rate of every step taken;
    ``lr_sum`` is their :func:`effective_lr_sum` (``K * eta_l`` for plain SGD
    with a constant lr), the denominator of the option-II control-variate
    update (Alg. 1 l. 12, :meth:`option_ii`)::

        c_i+ = c_i - c + (x - y_i) / (K * eta_l)

    (The paper states it for plain SGD; with momentum ``K * eta_l`` would
    overstate the mean gradient about ``1 / (1 - gamma)``-fold and the control
    variates then make training diverge, hence the momentum-aware sum.)

    Option I (``c_i+ = g_i(x)``, a full local gradient at the server model)
    needs the client's data and is computed by the method
    (:func:`osfl.methods.schemes.full_gradient`). With ``c == c_i == 0`` the
    correction adds exact zeros: training equals plain training bit for bit.
    """

    def __init__(
        self,
        c: Mapping[str, torch.Tensor] | None,
        c_i: Mapping[str, torch.Tensor] | None,
    ):
        self.c = None if c is None else {k: v.detach() for k, v in c.items()}
        self.c_i = None if c_i is None else {k: v.detach() for k, v in c_i.items()}
        self.lrs: list[float] = []
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._optimizer: torch.optim.Optimizer | None = None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        c = _paired(model, self.c, "ScaffoldCorrection (c)")
        ci = _paired(model, self.c_i, "ScaffoldCorrection (c_i)")
        pairs = []
        for (p, cs), (_, cc) in zip(c, ci, strict=True):
            if cs is None and cc is None:
                continue
            delta = (cs if cs is not None else 0.0) - (cc if cc is not None else 0.0)
            pairs.append((p, torch.as_tensor(delta, device=p.device, dtype=p.dtype)))
        self._pairs = pairs
        self._optimizer = optimizer
        self.lrs = []

    def before_step(self, model: nn.Module) -> None:
        if self._optimizer is not None:  # the lr this step uses (the schedule steps after it)
            self.lrs.append(float(self._optimizer.param_groups[0]["lr"]))
        _add_to_grads(self._pairs)

    @property
    def lr_sum(self) -> float:
        """:func:`effective_lr_sum` of the steps taken (momentum read from the optimizer)."""
        group = self._optimizer.param_groups[0] if self._optimizer is not None else {}
        momentum = float(group.get("momentum", 0.0) or 0.0)
        return effective_lr_sum(self.lrs, momentum, bool(group.get("nesterov", False)))

    @staticmethod
    def option_ii(
        c: Mapping[str, torch.Tensor] | None,
        c_i: Mapping[str, torch.Tensor] | None,
        x: Mapping[str, torch.Tensor],
        y: Mapping[str, torch.Tensor],
        lr_sum: float,
    ) -> dict[str, torch.Tensor]:
        """``c_i+ = c_i - c + (x - y) / lr_sum`` for every name of ``x`` (None = zeros)."""
        if not lr_sum > 0:
            raise ConfigError("SCAFFOLD option II needs at least one local step (lr_sum > 0)")
        out = {}
        for k, xk in x.items():
            v = (xk.detach().to(torch.float32) - y[k].detach().to(torch.float32)) / lr_sum
            if c_i is not None:
                v = v + c_i[k].to(torch.float32)
            if c is not None:
                v = v - c[k].to(torch.float32)
            out[k] = v
        return out

    def key(self) -> dict[str, Any]:
        return {"name": self.name, "state": _digest(self.c, self.c_i)}


@_register("feddyn")
class FedDynTerm(ObjectiveTerm):
    """FedDyn's dynamic regulariser [Acar et al., ICLR 2021, Alg. 1 l. 6]::

        L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||²

    ``extra_loss`` returns the last two terms; their gradient is
    ``-g_k + alpha (theta - theta^{t-1})`` with ``g_k`` the client's state
    (``grad_state``; ``None`` = zero, a client's first round). After local
    training the client updates its state with :meth:`next_grad_state`
    (Alg. 1 l. 7): ``g_k <- g_k - alpha (theta_k^t - theta^{t-1})``. With
    ``alpha == 0`` and no state the term adds nothing (plain training).
    """

    def __init__(
        self,
        global_params: Mapping[str, torch.Tensor] | nn.Module,
        grad_state: Mapping[str, torch.Tensor] | None,
        alpha: float,
    ):
        if not alpha >= 0.0:
            raise ConfigError(f"FedDynTerm alpha must be >= 0, got {alpha}")
        if isinstance(global_params, nn.Module):
            global_params = dict(global_params.named_parameters())
        self.global_params = {k: v.detach() for k, v in global_params.items()}
        self.grad_state = (
            None if grad_state is None else {k: v.detach() for k, v in grad_state.items()}
        )
        self.alpha = float(alpha)
        self._anchor: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._linear: list[tuple[torch.Tensor, torch.Tensor]] = []

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        anchor = _paired(model, self.global_params, "FedDynTerm (global weights)")
        self._anchor = [(p, g) for p, g in anchor if g is not None] if self.alpha > 0 else []
        lin = _paired(model, self.grad_state, "FedDynTerm (gradient state)")
        self._linear = [(p, g) for p, g in lin if g is not None]

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        total: torch.Tensor | None = None
        if self._anchor:
            sq = sum(((p - g) ** 2).sum() for p, g in self._anchor)
            total = 0.5 * self.alpha * sq
        if self._linear:
            lin = -sum((p * g).sum() for p, g in self._linear)
            total = lin if total is None else total + lin
        return total

    def next_grad_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``g_k - alpha (theta_k - theta^{t-1})`` per trainable parameter (CPU, float32)."""
        out = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            g = self.global_params[name].to("cpu", torch.float32)
            v = -self.alpha * (p.detach().to("cpu", torch.float32) - g)
            if self.grad_state is not None:
                v = v + self.grad_state[name].to("cpu", torch.float32)
            out[name] = v
        return out

    def key(self) -> dict[str, Any]:
        return {"name": self.name, "alpha": self.alpha, "state": _digest(self.grad_state)}


@_register("feddc")
class FedDCTerm(ObjectiveTerm):
    """FedDC's drift decoupling and gradient correction [Gao et al., CVPR 2022;
    as written in Chen & Vikalo, ICML 2024, Eq. 81]::

        L_k(theta) + alpha/2 ||theta + d_k - w||² + <theta, g_corr>,
        g_corr = (Delta theta_k^{t-1} - Delta Theta^{t-1}) / (eta * K)

    ``d_k`` is the client's local drift (``drift``; the sum of its past local
    updates, Eq. 82), ``w`` the global weights and ``g_corr`` the gradient
    correction (``correction``), the difference between the client's last
    local update and the global update of the last round over ``eta * K``
    (lr times local steps; with momentum the method uses
    :func:`effective_lr_sum`, as for SCAFFOLD). The penalty goes through ``extra_loss``; the
    correction's gradient is the constant ``g_corr``, added in
    ``before_step``. ``None`` state means zero; with ``alpha == 0`` and no
    state the term adds nothing (plain training).
    """

    def __init__(
        self,
        global_params: Mapping[str, torch.Tensor] | nn.Module,
        drift: Mapping[str, torch.Tensor] | None,
        correction: Mapping[str, torch.Tensor] | None,
        alpha: float,
    ):
        if not alpha >= 0.0:
            raise ConfigError(f"FedDCTerm alpha must be >= 0, got {alpha}")
        if isinstance(global_params, nn.Module):
            global_params = dict(global_params.named_parameters())
        self.global_params = {k: v.detach() for k, v in global_params.items()}
        self.drift = None if drift is None else {k: v.detach() for k, v in drift.items()}
        self.correction = (
            None if correction is None else {k: v.detach() for k, v in correction.items()}
        )
        self.alpha = float(alpha)
        self._anchor: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._correction: list[tuple[torch.Tensor, torch.Tensor]] = []

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._anchor = []
        if self.alpha > 0:
            anchor = _paired(model, self.global_params, "FedDCTerm (global weights)")
            drift = _paired(model, self.drift, "FedDCTerm (drift)")
            # the penalty pulls theta towards w - d_k
            self._anchor = [
                (p, g if d is None else g - d) for (p, g), (_, d) in zip(anchor, drift, strict=True)
            ]
        corr = _paired(model, self.correction, "FedDCTerm (correction)")
        self._correction = [(p, c) for p, c in corr if c is not None]

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        if not self._anchor:
            return None
        return 0.5 * self.alpha * sum(((p - a) ** 2).sum() for p, a in self._anchor)

    def before_step(self, model: nn.Module) -> None:
        _add_to_grads(self._correction)

    def key(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alpha": self.alpha,
            "state": _digest(self.drift, self.correction),
        }
