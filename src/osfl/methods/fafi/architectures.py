"""Which network each FAFI client trains, and the common weights it starts from.

Zeng et al., ICML 2025, Algorithm 1 line 1 and Table 8: the server broadcasts
one set of initial weights per architecture in use; clients may run different
architectures (``models``, cycled over the clients), which then share the
feature dimension through a projection (``feature_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.seeds import derive_seed
from osfl.fl.training import init_model
from osfl.methods.fafi.client import FAFINet
from osfl.methods.fafi.config import FAFIConfig


@dataclass(frozen=True)
class Architectures:
    """The clients' architectures of one run (all a function of public options)."""

    run: RunContext
    config: FAFIConfig

    def of(self, client: int) -> str:
        """Client ``client``'s model name: ``models`` cycled, or the run's model."""
        models = list(self.config.models)
        return models[client % len(models)] if models else self.run.model.name

    def names(self) -> list[str]:
        return sorted({self.of(c) for c in range(self.run.num_clients)})

    def spec(self, arch: str) -> ModelSpec:
        """The run's model spec for the run's model; otherwise ``arch`` with the
        image's channels and size plus ``model_kwargs[arch]``."""
        if arch == self.run.model.name:
            return self.run.model
        c, h, _ = self.run.image_shape
        kwargs = {"in_chans": c, "img_size": h, **dict(self.config.model_kwargs.get(arch, {}))}
        return ModelSpec(arch, kwargs)

    def cache_key(self, arch: str) -> Any:
        """``arch``'s part of a client-cache key: ``None`` for the run's model,
        which keeps the key equal to the baselines' (a shared cache entry)."""
        return None if arch == self.run.model.name else self.spec(arch).key()

    def build(self, arch: str) -> FAFINet:
        """A fresh FAFINet of ``arch`` (weights to be loaded)."""
        backbone = self.spec(arch).build(self.run.num_classes)
        return FAFINet(backbone, self.run.num_classes, self.config.feature_dim)

    def initial(self, arch: str) -> FAFINet:
        """Common initial weights from the run seed only (built on the server).

        The run's own model gets exactly :func:`osfl.fl.training.init_model`'s
        weights (so plain-CE clients equal the FedAvg clients); the prototypes
        are the same for every architecture.
        """
        seed = self.run.seed
        with torch.random.fork_rng(devices=[]):
            if arch == self.run.model.name:
                backbone = init_model(self.run)
            else:
                torch.manual_seed(derive_seed(seed, "fafi-model-init", arch))
                backbone = self.spec(arch).build(self.run.num_classes)
            torch.manual_seed(derive_seed(seed, "fafi-init", arch))
            net = FAFINet(backbone, self.run.num_classes, self.config.feature_dim)
        gen = torch.Generator().manual_seed(derive_seed(seed, "fafi-prototypes"))
        with torch.no_grad():
            shape = (self.run.num_classes, net.feature_dim)
            net.prototypes.copy_(self.config.proto_init_std * torch.randn(shape, generator=gen))
        return net
