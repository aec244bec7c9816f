"""Write a pretrained encoder: safetensors weights in this project's (timm-style)
names, then its model card (:mod:`osfl.pretrain.card`) with the file's sha256.

The weights hold the encoder's ``state_dict`` only (no DINO head or teacher
copy, no MAE decoder), so ``osfl.models.load_pretrained(model, path)`` /
``create_model(name, pretrained=path, **kwargs)`` load every key; a model with
another class count keeps its fresh head (``drop_head``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

import osfl
from osfl.fl.provenance import compute_environment
from osfl.pretrain.card import CARD_SCHEMA, card_path, sha256_file, write_card
from osfl.pretrain.config import PretrainConfig, to_dict
from osfl.pretrain.objectives import OBJECTIVES
from osfl.pretrain.train import PretrainResult
from osfl.pretrain.upstream import Upstream


def write_weights(model: nn.Module, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Save ``model.state_dict()`` as safetensors; returns the card's ``weights`` block."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(p), metadata={"format": "pt"})
    return {
        "file": p.name,
        "sha256": sha256_file(p),
        "bytes": p.stat().st_size,
        "format": "safetensors",
        "layout": "timm",
        "tensors": len(state),
    }


def upstream_block(upstream: Upstream) -> dict[str, Any]:
    """The card's ``upstream`` block: what the encoder has seen (checked by
    :func:`~osfl.pretrain.card.check_disjoint`), known before training."""
    train = upstream.train
    return {
        "source": upstream.source,
        "classes": list(upstream.classes),
        "class_indices": list(upstream.class_indices),
        "num_images": len(train),
        "images_per_class": [int(n) for n in train.class_counts()],
        "image_shape": list(train.image_shape),
        "fingerprint": train.fingerprint(),
        "load_options": dict(upstream.options),
        "held_out": {
            "split": "the source's test split, same classes",
            "num_images": len(upstream.held_out),
            "fingerprint": upstream.held_out.fingerprint(),
        },
    }


def build_card(
    cfg: PretrainConfig,
    upstream: Upstream,
    result: PretrainResult,
    weights: dict[str, Any],
    command: Sequence[str],
) -> dict[str, Any]:
    """The full card (schema :data:`~osfl.pretrain.card.CARD_SCHEMA`; docs/pretrain.md)."""
    entry = OBJECTIVES.get(cfg.objective)
    enc = result.encoder
    return {
        "schema": CARD_SCHEMA,
        "weights": weights,
        "model": {
            "name": cfg.model.name,
            "kwargs": dict(cfg.model.kwargs),
            "num_classes": int(enc.get_classifier().out_features),  # type: ignore[operator]
            "parameters": sum(p.numel() for p in enc.parameters()),
            "head": result.head,
        },
        "upstream": upstream_block(upstream),
        "image_size": upstream.train.image_shape[-1],
        "normalization": {"mean": list(result.mean), "std": list(result.std)},
        "objective": {"name": entry.name, "options": to_dict(entry.options_from(cfg))},
        "training": {
            "epochs": cfg.train.epochs,
            "steps": result.steps,
            "batch_size": cfg.train.batch_size,
            "optimizer": {
                k: v
                for k, v in dataclasses.asdict(result.train).items()
                if k not in ("epochs", "steps", "batch_size")
            },
            "warmup_epochs": cfg.warmup_epochs,
            "seed": cfg.seed,
            "device": result.device,
            "seconds": round(result.seconds, 1),
            # the same command in the same environment (torch, CPU kernel path,
            # threads) gives the same weights, bit for bit; another thread count
            # or kernel path sums in another order and gives other last bits
            "environment": compute_environment(result.device),
        },
        "results": {
            "final_loss": result.final_loss,
            "loss_per_epoch": result.loss_per_epoch,
            "held_out": result.held_out,
        },
        "provenance": {
            "command": " ".join(command),
            "config": to_dict(cfg),
            "osfl_version": osfl.__version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
    }


def save_encoder(
    cfg: PretrainConfig,
    upstream: Upstream,
    result: PretrainResult,
    path: str | os.PathLike[str],
    command: Sequence[str],
) -> tuple[Path, dict[str, Any]]:
    """Write the weights, then the card next to them; returns (card path, card)."""
    weights = write_weights(result.encoder, path)
    card = build_card(cfg, upstream, result, weights, command)
    write_card(path, card)
    return card_path(path), card
