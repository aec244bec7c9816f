"""Run one method in simulation on a SeedContext; a model's state on the CPU."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from osfl.assembly import SeedContext
from osfl.fl.runtime.simulation import run_simulation


def simulate(method_cls: type, config: Any, ctx: SeedContext, **kw: Any) -> Any:
    method = method_cls(config, ctx.run)
    kw.setdefault("threads_per_client", 1)
    return run_simulation(method, ctx.run, ctx.splits.train, ctx.federation, **kw)


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}
