"""The frozen, public encoder of FALCON, FedPFT and FedCGS.

All three methods (Liu et al., "Feature-Aware One-Shot Federated Learning via
Hierarchical Token Sequences" (FALCON), 2025, §2.3; Beitollahi et al.,
"Parametric Feature Transfer: One-shot Federated Learning with Foundation
Models" (FedPFT), 2024, §3; Guan, Zhou & Gu (FedCGS), 2025) run every image
through one pretrained encoder that nobody trains. A *token* is what the
encoder's ``forward_features`` returns for one view: for the ViT/DINOv2
family with ``global_pool="token"`` the class-token output after the final
norm (the paper's CLS token); for ``global_pool="avg"`` the mean patch token;
for a CNN its globally pooled feature. The classification head of the
registered model is never used.

The encoder is the run's ``model`` spec (``model.kwargs.pretrained: PATH``
loads a checkpoint, docs/models.md). Without ``pretrained`` its weights are
the run's common random initial weights (``osfl.fl.training.init_model``'s
seed), which every party draws identically; :meth:`FrozenEncoder.describe`
says which of the two a run used, so a table never passes off random
features as DINOv2's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.cache import state_hash
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.seeds import derive_seed

__all__ = [
    "EncoderConfig",
    "FrozenEncoder",
    "build_encoder",
    "build_frozen_encoder",
    "encoder_spec",
]


@dataclass(frozen=True)
class EncoderConfig:
    """How the frozen encoder is run.

    ``size``: its input resolution (``null``: the run model's ``img_size``,
    i.e. the data's image size). FALCON's paper encodes 224 px views of 448 px
    images with DINOv2-B/14: ``size=224`` with ``data.image_size=448``; a ViT's
    position embeddings are built (and a checkpoint's resampled) for ``size``.
    ``batch_size``: images per encoder forward pass (memory only; tokens do
    not depend on it beyond float rounding).
    """

    #: input resolution of the frozen encoder (null: the data's image size)
    size: int | None = None
    #: images per encoder forward pass (memory only)
    batch_size: int = 128

    def __post_init__(self) -> None:
        if self.size is not None and (isinstance(self.size, bool) or self.size < 1):
            raise ConfigError(f"encoder.size must be a positive integer or null, got {self.size}")
        if self.batch_size < 1:
            raise ConfigError(f"encoder.batch_size must be >= 1, got {self.batch_size}")


def encoder_spec(run: RunContext, cfg: EncoderConfig) -> tuple[ModelSpec, int]:
    """The model spec the encoder is built from and its input size."""
    kwargs = dict(run.model.kwargs)
    if cfg.size is not None:
        kwargs["img_size"] = cfg.size
    size = kwargs.get("img_size", run.image_shape[1])
    if not isinstance(size, int) or isinstance(size, bool):
        raise ConfigError(
            f"the frozen encoder needs a square integer input size, got img_size={size!r}; "
            "set method.<name>.encoder.size"
        )
    return ModelSpec(run.model.name, kwargs), size


class FrozenEncoder(nn.Module):
    """Images (B, C, size, size), already normalised, -> tokens (B, D).

    Always in eval mode with ``requires_grad=False``: ``train()`` is a no-op,
    so a method that puts its predictor in training mode cannot switch on
    dropout in the encoder.
    """

    def __init__(self, model: nn.Module, size: int, name: str, pretrained: str | None):
        super().__init__()
        if not hasattr(model, "forward_features") or not hasattr(model, "num_features"):
            raise ConfigError(
                f"model {name!r} has no forward_features/num_features; the frozen-encoder "
                "methods need a registered osfl image classifier"
            )
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.size = size
        self.dim = int(model.num_features)
        self.name = name
        self.pretrained = pretrained
        self._hash: str | None = None

    def train(self, mode: bool = True) -> FrozenEncoder:
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)

    @property
    def hash(self) -> str:
        """Content hash of the weights (:func:`osfl.fl.cache.state_hash`): what
        clients check against the broadcast and what token cache keys hold."""
        if self._hash is None:
            self._hash = state_hash(self.model.state_dict())
        return self._hash

    def describe(self) -> dict[str, Any]:
        """JSON-able identity for reports: name, input size, token width,
        whether the weights are a checkpoint (and which) or random, and the hash."""
        return {
            "name": self.name,
            "size": self.size,
            "dim": self.dim,
            "weights": "pretrained" if self.pretrained else "random",
            "pretrained": self.pretrained,
            "hash": self.hash,
        }


def build_frozen_encoder(run: RunContext, cfg: EncoderConfig) -> FrozenEncoder:
    """The run's model as a frozen encoder, on ``run.device``.

    Random weights come from the run's common initial-weight seed, so with
    ``size`` equal to the model's ``img_size`` they equal every other
    method's initial model; a checkpoint is loaded by ``create_model``.
    """
    spec, size = encoder_spec(run, cfg)
    return build_encoder(spec, size, run.num_classes, run.seed, run.device)


def build_encoder(
    spec: ModelSpec, size: int, num_classes: int, seed: int, device: torch.device | str = "cpu"
) -> FrozenEncoder:
    """A frozen encoder from a model spec (``kwargs.pretrained`` loads a
    checkpoint; otherwise the weights of run seed ``seed``), e.g. for an
    audit that rebuilds the public encoder from an Observation's hparams."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "global-init"))
        model = spec.build(num_classes)
    pretrained = spec.kwargs.get("pretrained")
    return FrozenEncoder(model, size, spec.name, str(pretrained) if pretrained else None).to(device)
