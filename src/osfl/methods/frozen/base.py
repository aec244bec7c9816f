"""What the frozen-encoder methods (FALCON, FedPFT, FedCGS) share as osfl
:class:`~osfl.fl.method.Method` s: the encoder's identity instead of a
broadcast model, the client's cached tokens, the predictor (frozen encoder +
a head on tokens) and honest byte and FLOP accounting for ``report()``.

The encoder is public and frozen, so the server broadcasts no weights: an
empty tensor set whose metadata carries the encoder's name and weight hash.
Each client checks the hash against its own copy before encoding anything,
so a site with another checkpoint (or another random seed) fails loudly
instead of uploading statistics of different features. Bytes down are then
a few hundred bytes per client, which is what the method really sends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, ModelSpec, RunContext
from osfl.fl.method import Method, MethodCard, Predictor
from osfl.fl.upload import Broadcast, Upload
from osfl.methods.clients import public_fl_hparams
from osfl.methods.frozen.encoder import (
    EncoderConfig,
    FrozenEncoder,
    build_frozen_encoder,
    encoder_spec,
)
from osfl.methods.frozen.tokens import client_tokens, encode_batch
from osfl.methods.frozen.views import ViewSet

__all__ = [
    "FrozenEncoderMethod",
    "TokenPredictor",
    "flops_per_sample",
    "part_bytes",
]


class TokenPredictor(Predictor):
    """Transformed images -> views -> frozen encoder -> ``head`` on the
    token sequence (B, V, D) -> class scores.

    It takes the run's evaluation-transformed images (normalised once, by the
    run) and builds the views itself, so the global model of FALCON is
    exactly "HSE encoder + global classifier" (paper Eq. after 13).
    """

    def __init__(self, encoder: FrozenEncoder, views: Sequence[ViewSet], head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.views = list(views)
        self.head = head

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return encode_batch(self.encoder, x, self.views).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.tokens(x))


def part_bytes(upload: Upload, parts: Mapping[str, Callable[[str], bool]]) -> dict[str, int]:
    """Bytes of an upload by part: ``total`` is the exact serialised size (what
    crossed the network), each named part the raw bytes of the tensors whose
    key it claims, ``overhead`` the rest (safetensors header + metadata)."""
    total = upload.nbytes
    out: dict[str, int] = {}
    for name, claims in parts.items():
        out[name] = sum(
            t.numel() * t.element_size() for k, t in upload.tensors.items() if claims(k)
        )
    out["overhead"] = total - sum(out.values())
    out["total"] = total
    return out


def flops_per_sample(sample: Callable[[], torch.Tensor]) -> float:
    """GFLOPs per generated sample of ``sample()`` (a batch), counted by
    ``torch.utils.flop_counter.FlopCounterMode``. It counts matrix products
    and convolutions only (elementwise work such as adding Gaussian noise is
    free to it), which is the paper's Fig. 5 convention for model FLOPs."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = sample()
    n = max(int(out.shape[0]), 1)
    return counter.get_total_flops() / n / 1e9


#: The tiny ViT encoder the frozen-encoder methods' smoke runs use.
TINY_VIT_SMOKE = (
    "data.image_size=16",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 64, num_heads: 2}",
)


class FrozenEncoderMethod(Method):
    """Base of the frozen-encoder methods: ``Config`` has an ``encoder``
    (:class:`EncoderConfig`) field; subclasses say which views they encode."""

    card: ClassVar[MethodCard] = MethodCard(regime="frozen_encoder", uploads="statistics")

    def __init__(self, config: Any, run: RunContext):
        super().__init__(config, run)
        self._encoder: FrozenEncoder | None = None
        self._meta: nn.Module | None = None
        self._lock = threading.Lock()

    # --- encoder -----------------------------------------------------------
    @property
    def encoder_config(self) -> EncoderConfig:
        return self.config.encoder

    def encoder(self) -> FrozenEncoder:
        """The frozen encoder, built once per process (public and identical for
        every party, so it is not per-client state)."""
        with self._lock:
            if self._encoder is None:
                self._encoder = build_frozen_encoder(self.run, self.encoder_config)
            return self._encoder

    def encoder_size(self) -> int:
        return encoder_spec(self.run, self.encoder_config)[1]

    def _structure(self) -> nn.Module:
        """The encoder's architecture on the meta device (no weights, no
        checkpoint read), for shapes and checks."""
        if self._meta is None:
            spec, _ = encoder_spec(self.run, self.encoder_config)
            kwargs = {k: v for k, v in spec.kwargs.items() if k != "pretrained"}
            self._meta = ModelSpec(spec.name, kwargs).build_meta(self.run.num_classes)
        return self._meta

    def token_dim(self) -> int:
        """D: the encoder's token width."""
        return int(self._structure().num_features)

    def view_sets(self) -> list[ViewSet]:
        """The view families this method encodes, in sequence order."""
        return [ViewSet("global", self.encoder_size())]

    def check(self) -> None:
        """The model is an osfl classifier with a pooled feature, the views fit
        the images, and the encoder is built for square inputs."""
        structure = self._structure()
        if not hasattr(structure, "forward_features") or not hasattr(structure, "num_features"):
            raise ConfigError(
                f"method {self.name}: model {self.run.model.name!r} has no pooled feature "
                "(forward_features/num_features); use a registered osfl model"
            )
        self.view_sets()  # resolves and checks window/stride/input sizes

    # --- protocol pieces ----------------------------------------------------
    def init_state(self) -> dict[str, Any]:
        return {"encoder": self.encoder().describe()}

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        enc = state["encoder"]
        return Broadcast(tensors={}, meta={"encoder": enc["name"], "encoder_hash": enc["hash"]})

    def check_broadcast(self, ctx: ClientContext, broadcast: Broadcast) -> FrozenEncoder:
        """This client's encoder, after checking it is the one the server announced."""
        enc = self.encoder()
        announced = broadcast.meta.get("encoder_hash")
        if announced != enc.hash:
            raise ConfigError(
                f"client {ctx.client_id}: the server announced encoder weights "
                f"{announced!r} but this client's {enc.name!r} hashes to {enc.hash!r} "
                "(another checkpoint, model.kwargs or seed); every party must load the "
                "same model.kwargs.pretrained"
            )
        return enc

    def client_tokens(self, ctx: ClientContext, data: Any, encoder: FrozenEncoder) -> torch.Tensor:
        """(N, V, D) tokens of this client's images (cached by content)."""
        return client_tokens(
            ctx, data, encoder, self.view_sets(), batch_size=self.encoder_config.batch_size
        )

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp
