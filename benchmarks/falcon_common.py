"""Shared set-up of the FALCON audit benchmarks (``falcon_mmd.py``,
``falcon_inversion.py``): a config (+ dotted overrides) -> data, federation,
run context and a FALCON method built exactly as ``osfl run`` would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from osfl import assembly
from osfl.config import load_config
from osfl.fl.context import ClientContext
from osfl.methods.falcon import FALCON


def falcon_setup(
    config: str, overrides: Sequence[str], **falcon: Any
) -> tuple[Any, assembly.SeedContext, FALCON]:
    """``(cfg, seed context of the first seed, FALCON with method.falcon + falcon)``."""
    cfg = load_config(config, list(overrides))
    splits = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, splits, cfg.seeds[0])
    over = {**cfg.method.get("falcon", {}), **falcon}
    from osfl.config import method_config

    method = FALCON(method_config(FALCON, over), ctx.run)
    method.check()
    return cfg, ctx, method


def client(ctx: assembly.SeedContext, c: int) -> tuple[ClientContext, Any]:
    data = ctx.splits.train.subset(ctx.federation.client_indices[c].copy())
    return ClientContext(ctx.run, c, 0, torch.Generator().manual_seed(c)), data
