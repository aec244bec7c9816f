"""Shared machinery of the methods that classify from a frozen, public
encoder (FALCON, FedPFT, FedCGS): the encoder (:mod:`.encoder`), its views
including FALCON's hierarchical scale encoding (:mod:`.views`), tokens cached
by content (:mod:`.tokens`), the tensor training loop they share
(:mod:`osfl.fl.tensor_fit`, re-exported), the Method base with the predictor
and byte/FLOP accounting (:mod:`.base`) and the public encoder as a token
inversion attack sees it (:mod:`.inversion`).
"""

from osfl.fl.tensor_fit import FitConfig, fit
from osfl.methods.frozen.base import (
    FrozenEncoderMethod,
    TokenPredictor,
    flops_per_sample,
    part_bytes,
)
from osfl.methods.frozen.encoder import EncoderConfig, FrozenEncoder, build_frozen_encoder
from osfl.methods.frozen.tokens import (
    cached_module,
    client_tokens,
    encode_batch,
    encode_images,
    token_key_parts,
)
from osfl.methods.frozen.views import HSEConfig, ViewSet, global_view, region_views

__all__ = [
    "EncoderConfig",
    "FitConfig",
    "FrozenEncoder",
    "FrozenEncoderMethod",
    "HSEConfig",
    "TokenPredictor",
    "ViewSet",
    "build_frozen_encoder",
    "cached_module",
    "client_tokens",
    "encode_batch",
    "encode_images",
    "fit",
    "flops_per_sample",
    "global_view",
    "part_bytes",
    "region_views",
    "token_key_parts",
]
