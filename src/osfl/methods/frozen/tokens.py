"""Tokens of a client's images under the frozen encoder, computed once and
cached by content.

Encoding is the only expensive step FALCON, FedPFT and FedCGS share (a
DINOv2-B forward per view), and it depends only on the pixels, the encoder
weights, the evaluation transform and the views. Each (client, view family)
is one entry of the run's :class:`~osfl.fl.cache.ClientCache` (safetensors +
JSON sidecar, written atomically) keyed by the data fingerprint, the client
id, the encoder's weight hash (:func:`osfl.fl.cache.state_hash`), the view
spec and the transform, so a second method on the same clients — or FALCON
after FedCGS, which encodes the same global view — reads the tokens instead
of running the encoder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from osfl.fl.cache import transform_key
from osfl.fl.provenance import compute_environment
from osfl.methods.frozen.encoder import FrozenEncoder
from osfl.methods.frozen.views import ViewSet

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform
    from osfl.fl.context import ClientContext
    from osfl.fl.progress import Progress

__all__ = [
    "TOKEN_CACHE_FORMAT",
    "cached_module",
    "client_tokens",
    "encode_batch",
    "encode_images",
    "token_key_parts",
]

log = logging.getLogger(__name__)

#: Bumped when the meaning of a cached token entry changes.
TOKEN_CACHE_FORMAT = 1


def encode_batch(encoder: FrozenEncoder, x: torch.Tensor, views: Sequence[ViewSet]) -> torch.Tensor:
    """A normalised float batch (B, C, H, W) -> tokens (B, V, D), the view
    families in order (e.g. global then regions: FALCON's [s⁽⁰⁾, s⁽¹⁾..s⁽ᴸ⁾])."""
    parts = []
    for vs in views:
        v = vs(x)
        b, n = v.shape[:2]
        parts.append(encoder(v.flatten(0, 1)).reshape(b, n, -1))
    return torch.cat(parts, dim=1)


def encode_images(
    encoder: FrozenEncoder,
    images: torch.Tensor,
    transform: Transform | None,
    views: Sequence[ViewSet],
    *,
    batch_size: int,
    device: torch.device,
    progress: Progress | None = None,
    description: str = "encoding",
) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 tokens (N, V, D) on the CPU,
    ``batch_size`` images per forward, on ``device``, without gradients."""
    out = []
    steps = (len(images) + batch_size - 1) // batch_size
    task = progress.task(description, steps) if progress is not None else None
    try:
        with torch.no_grad():
            for i in range(0, len(images), batch_size):
                xb = images[i : i + batch_size].to(device)
                x = transform(xb) if transform is not None else xb.float() / 255
                out.append(encode_batch(encoder, x, views).float().cpu())
                if task is not None:
                    task.advance()
    finally:
        if task is not None:
            task.close()
    if not out:
        d = encoder.dim
        return torch.zeros(0, sum(v.num_views for v in views), d)
    return torch.cat(out)


def token_key_parts(
    ctx: ClientContext, data: ImageSet, encoder: FrozenEncoder, views: Sequence[ViewSet]
) -> dict[str, Any]:
    """What determines a client's tokens: the identity every cache entry
    derived from them (tokens, trained generators, classifiers) is keyed by."""
    return {
        "format": TOKEN_CACHE_FORMAT,
        "data": data.fingerprint(),
        "client": ctx.client_id,
        "encoder": encoder.hash,
        "views": [vs.key() for vs in views],
        "transform": transform_key(ctx.run.eval_transform),
        "environment": compute_environment(ctx.device),  # threads, kernels, torch: the last bits
    }


def cached_module(
    ctx: ClientContext,
    model: nn.Module,
    parts: Mapping[str, Any],
    train: Callable[[], object],
) -> nn.Module:
    """``model`` trained by ``train()``, or its weights from the run's cache
    when an entry keyed by ``parts`` exists (e.g. FALCON's 400-epoch generator,
    shared by the w/o-KD ablation and by sweeps over server options)."""
    cache = ctx.run.cache
    if cache is None:
        train()
        return model.eval()
    key = cache.key(**parts)
    state = cache.get(key, like=model.state_dict())
    if state is not None:
        model.load_state_dict(state)
        log.debug("client %d: %s from the cache", ctx.client_id, parts.get("kind"))
        return model.eval()
    train()
    cache.put(key, model.state_dict(), {"parts": dict(parts)})
    return model.eval()


def client_tokens(
    ctx: ClientContext,
    data: ImageSet,
    encoder: FrozenEncoder,
    views: Sequence[ViewSet],
    *,
    batch_size: int,
) -> torch.Tensor:
    """Tokens (N, V, D) of ``data`` for ``views``, one cache entry per view
    family (through ``ctx.run.cache`` when the run has one)."""
    run = ctx.run
    parts = []
    for vs in views:
        cache = run.cache
        if cache is None:
            parts.append(_encode(ctx, data, encoder, vs, batch_size))
            continue
        key = cache.key(kind="frozen-tokens", **token_key_parts(ctx, data, encoder, [vs]))
        got = cache.get(key)
        if got is not None and "tokens" in got and got["tokens"].shape[0] == len(data):
            log.debug("client %d: %s tokens from the cache", ctx.client_id, vs.kind)
            parts.append(got["tokens"].float())
            continue
        tokens = _encode(ctx, data, encoder, vs, batch_size)
        cache.put(
            key,
            {"tokens": tokens},
            {
                "parts": {
                    "kind": "frozen-tokens",
                    "client": ctx.client_id,
                    "data": data.fingerprint(),
                    "encoder": encoder.describe(),
                    "views": vs.key(),
                },
                "shape": list(tokens.shape),
            },
        )
        parts.append(tokens)
    return torch.cat(parts, dim=1)


def _encode(
    ctx: ClientContext, data: ImageSet, encoder: FrozenEncoder, vs: ViewSet, batch_size: int
) -> torch.Tensor:
    return encode_images(
        encoder,
        data.images,
        ctx.run.eval_transform,
        [vs],
        batch_size=batch_size,
        device=ctx.device,
        progress=ctx.run.progress,
        description=f"client {ctx.client_id}: encoding {vs.kind} views",
    )
