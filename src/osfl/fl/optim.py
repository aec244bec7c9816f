"""Optimizer and learning-rate schedule registries for local training.

Local training in FL papers uses a handful of optimizers (plain SGD in
FedAvg [McMahan et al., 2017] and the privacy-audit threat models, SGD with
momentum in FedProx/FedDyn/one-shot baselines, Adam/AdamW for ViTs) and a few
schedules (constant, cosine [Loshchilov & Hutter, SGDR, 2017], step decay,
linear warm-up then cosine as in DeiT). Each is a small factory registered by
name, so a config names them as strings and nothing dispatches on ``if/elif``.

Schedules are *multipliers of the base lr per optimizer step* (not per epoch):
a client with 7 local steps and one with 700 follow the same curve, which is
what one-shot FL with unequal client sizes needs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR

from osfl.errors import ConfigError
from osfl.registry import Registry


@dataclass(frozen=True)
class OptimConfig:
    """An optimizer and its learning-rate schedule: the fields local training
    (:class:`~osfl.fl.train_config.TrainConfig`) and server-side distillation
    share, defined (and checked) once.

    ``momentum`` is used by ``sgdm`` and ``nesterov`` only; plain ``sgd`` has
    none. ``warmup_steps`` puts a linear warm-up in front of any ``schedule``;
    ``step_size`` / ``gamma`` shape the ``step`` schedule (``step_size=None``:
    decay at each third of training).
    """

    #: sgd, sgdm (with momentum), nesterov, adam or adamw
    optimizer: str = "sgd"
    #: base learning rate
    lr: float = 0.01
    #: momentum of sgdm and nesterov (sgd, adam and adamw ignore it)
    momentum: float = 0.9
    #: L2 weight decay (decoupled for adamw)
    weight_decay: float = 0.0
    #: learning-rate schedule over the optimizer steps: constant, cosine, warmup_cosine or step
    schedule: str = "constant"
    #: steps of linear warm-up before the schedule (0: none)
    warmup_steps: int = 0
    #: steps between decays of the step schedule (null: decay at each third of training)
    step_size: int | None = None
    #: decay factor of the step schedule
    gamma: float = 0.1
    #: clip the gradient norm to this value (null: no clipping)
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        need(self.lr > 0 and math.isfinite(self.lr), f"lr must be > 0, got {self.lr}")
        need(0.0 <= self.momentum < 1.0, f"momentum must lie in [0, 1), got {self.momentum}")
        need(self.weight_decay >= 0.0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(
            self.step_size is None or self.step_size >= 1,
            f"step_size must be >= 1 or null, got {self.step_size}",
        )
        need(0.0 < self.gamma <= 1.0, f"gamma must lie in (0, 1], got {self.gamma}")
        need(
            self.grad_clip is None or self.grad_clip > 0,
            f"grad_clip must be > 0 or null, got {self.grad_clip}",
        )
        OPTIMIZERS.get(self.optimizer)  # unknown names -> ConfigError listing valid ones
        SCHEDULES.get(self.schedule)

    @property
    def applied_momentum(self) -> float:
        """The momentum the optimizer really applies (0 for sgd/adam/adamw)."""
        return self.momentum if OPTIMIZERS.get(self.optimizer).uses_momentum else 0.0


@dataclass(frozen=True)
class OptimizerEntry:
    """A registered optimizer: its factory and whether it uses ``cfg.momentum``.

    ``uses_momentum`` lets the public hyper-parameters (what a server knows, for
    privacy audits) report the momentum actually applied: 0 for plain SGD.
    """

    build: Callable[[list[torch.nn.Parameter], OptimConfig], torch.optim.Optimizer]
    uses_momentum: bool


OPTIMIZERS: Registry[OptimizerEntry] = Registry("optimizer")
SCHEDULES: Registry[Callable[[OptimConfig, int], Callable[[int], float]]] = Registry("schedule")


def _sgd(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    # foreach left to torch: multi-tensor kernels on CUDA, the per-tensor loop on CPU
    # (which has no fused kernels; its grouping step only adds overhead there).
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _sgdm(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _nesterov(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params,
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=True,
        weight_decay=cfg.weight_decay,
    )


def _adam(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _adamw(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


OPTIMIZERS.add("sgd", OptimizerEntry(_sgd, uses_momentum=False))
OPTIMIZERS.add("sgdm", OptimizerEntry(_sgdm, uses_momentum=True))
OPTIMIZERS.add("nesterov", OptimizerEntry(_nesterov, uses_momentum=True))
OPTIMIZERS.add("adam", OptimizerEntry(_adam, uses_momentum=False))
OPTIMIZERS.add("adamw", OptimizerEntry(_adamw, uses_momentum=False))


@SCHEDULES.register("constant")
def _constant(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    return lambda step: 1.0


def _cosine_after(warmup: int, total_steps: int) -> Callable[[int], float]:
    """Half-cosine from 1 to 0 over the steps after ``warmup``."""
    span = max(1, total_steps - warmup)

    def f(step: int) -> float:
        t = min(max(step - warmup, 0), span) / span
        return 0.5 * (1.0 + math.cos(math.pi * t))

    return f


@SCHEDULES.register("cosine")
def _cosine(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    return _cosine_after(cfg.warmup_steps, total_steps)


@SCHEDULES.register("warmup_cosine")
def _warmup_cosine(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    if cfg.warmup_steps < 1:
        raise ConfigError(
            "schedule 'warmup_cosine' needs warmup_steps >= 1 (e.g. warmup_steps=100)"
        )
    return _cosine_after(cfg.warmup_steps, total_steps)


@SCHEDULES.register("step")
def _step(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    # Default: decay at 1/3 and 2/3 of training, the common "two drops" recipe.
    size = cfg.step_size if cfg.step_size is not None else max(1, math.ceil(total_steps / 3))
    gamma = cfg.gamma
    return lambda step: gamma ** (step // size)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimConfig
) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` over the parameters that require grad."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ConfigError("the model has no trainable parameters (all requires_grad=False)")
    return OPTIMIZERS.get(cfg.optimizer).build(trainable, cfg)


def fused(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with ``fused=True`` on CUDA, where torch has fused
    SGD, Adam and AdamW kernels (one launch for all parameters, no host-side
    step counter). Left as it is on the CPU (torch's fused CPU kernels would
    change today's numbers), for other optimizers, and once it has state.
    :func:`build_optimizer` builds one parameter group from ``defaults``, so
    the rebuild is that optimizer with one option more; a separate step
    because the CPU paths (the batched loop, tensor fits) must not take it."""
    fusable = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
    if device.type != "cuda" or type(optimizer) not in fusable or len(optimizer.param_groups) != 1:
        return optimizer
    if optimizer.state:  # already stepped: keep its state
        return optimizer
    accepted = inspect.signature(type(optimizer).__init__).parameters
    # defaults may hold more than the constructor takes (AdamW's decoupled_weight_decay)
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    defaults.update(fused=True, foreach=None)
    return type(optimizer)(optimizer.param_groups[0]["params"], **defaults)


def is_constant_schedule(cfg: OptimConfig) -> bool:
    """True when the lr never changes (no scheduler needed)."""
    return cfg.schedule == "constant" and cfg.warmup_steps == 0


def build_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> LambdaLR:
    """``cfg.schedule`` as a per-step multiplier, with a linear warm-up of
    ``cfg.warmup_steps`` in front of any schedule (warm-up step ``i`` uses
    ``(i + 1) / warmup_steps`` so the first step already moves the weights)."""
    base = SCHEDULES.get(cfg.schedule)(cfg, total_steps)
    warmup = cfg.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return base(step)

    return LambdaLR(optimizer, factor)


def lr_at(cfg: OptimConfig, total_steps: int) -> list[float]:
    """The learning rate of every step of a run (for plots, audits and tests)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([p], cfg)
    sched = build_schedule(opt, cfg, total_steps)
    out = []
    for _ in range(total_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out
