"""FAFI's final classifier from the server state: global prototypes and fused features.

Zeng et al., ICML 2025, §4.3 and Algorithm 1 lines 10–12: the server averages
the clients' prototypes into ``P_g`` and predicts with IFFI (Eq. 8–10,
:class:`~osfl.methods.fafi.fusion.IFFIPredictor`) over the uploaded
extractors. The ablations fuse by a plain or data-size-weighted mean, by the
median (robust, not in the paper), or average the extractors' parameters
(``fusion="params"``, one architecture only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import Predictor
from osfl.fl.seeds import derive_seed
from osfl.methods.clients import average_states
from osfl.methods.fafi.architectures import Architectures
from osfl.methods.fafi.config import FAFIConfig
from osfl.methods.fafi.fusion import IFFIPredictor, global_prototypes, median_prototypes


def masked_mean_prototypes(prototypes: list[torch.Tensor]) -> torch.Tensor:
    """Per class, the mean over the clients whose row is non-zero (class-mean prototypes)."""
    stack = torch.stack([p.float() for p in prototypes])
    present = (stack.abs().sum(-1) > 0).float()
    return (stack * present[..., None]).sum(0) / present.sum(0).clamp(min=1)[:, None]


def class_counts_of(clients: Mapping[int, Mapping[str, Any]]) -> torch.Tensor:
    """M×C: each client's uploaded per-class sample counts (``meta.class_counts``),
    in client order: who holds which class."""
    return torch.tensor([list(clients[c]["class_counts"]) for c in sorted(clients)])


def server_prototypes(config: FAFIConfig, clients: Mapping[int, Mapping[str, Any]]) -> torch.Tensor:
    """``P_g`` from the clients' uploads: their mean (Algorithm 1), the mean over
    the clients that hold a class (class-mean prototypes), or the median over
    the clients whose class counts say they hold it."""
    protos = [clients[c]["prototypes"] for c in sorted(clients)]
    if config.fusion == "median":  # robust for classes with >= 3 holders (median_prototypes)
        return median_prototypes(protos, class_counts_of(clients))
    if config.prototype_kind == "class_mean":
        return masked_mean_prototypes(protos)
    return global_prototypes(protos)


def client_extractor(arches: Architectures, state: Mapping[str, Any], client: int) -> nn.Module:
    """Client ``client``'s uploaded extractor, in eval mode."""
    ext = arches.build(arches.of(client)).extractor()
    ext.load_state_dict(state["clients"][client]["extractor"], strict=True)
    return ext.eval()


def fafi_predictor(arches: Architectures, state: Mapping[str, Any]) -> Predictor:
    """The predictor the config's ``fusion`` and ``scoring`` ask for."""
    clients = state["clients"]
    ids = sorted(clients)
    protos = server_prototypes(arches.config, clients)
    cfg = arches.config
    if cfg.fusion == "params":
        if len({arches.of(c) for c in ids}) > 1:
            raise ConfigError(
                "method.fafi: fusion='params' averages parameters and needs one "
                "architecture for all clients; use fusion='iffi' or 'average'"
            )
        weights = [clients[c]["num_samples"] for c in ids]
        avg = average_states([clients[c]["extractor"] for c in ids], weights)
        ext = arches.build(arches.of(ids[0])).extractor()
        ext.load_state_dict(avg, strict=True)
        return IFFIPredictor([ext.eval()], protos, fusion="average", scoring=cfg.scoring)
    noise = cfg.noise
    if noise.seed is None:  # the run's own draw
        noise = replace(noise, seed=derive_seed(arches.run.seed, "fafi-noise"))
    return IFFIPredictor(
        [client_extractor(arches, state, c) for c in ids],
        protos,
        fusion=cfg.fusion,
        noise=noise if cfg.fusion == "iffi" else None,
        normalize_features=cfg.normalize_features,
        client_weights=[float(clients[c]["num_samples"]) for c in ids],
        scoring=cfg.scoring,
    )
