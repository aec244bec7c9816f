"""FENS's INT8 client models: the weights of every convolution and linear layer
quantised per tensor, symmetric, to signed 8 bits; everything else (biases,
BatchNorm's parameters and statistics) stays float32.

That is the weight half of what the authors run (``sacs-epfl/fens`` a349903,
``generate_logits_v2.py`` lines 123–142): PyTorch's eager post-training
quantisation with ``torch.quantization.default_qconfig``, whose weight observer
is ``MinMaxObserver(dtype=qint8, qscheme=per_tensor_symmetric)``:

    scale = max(|w|) / 127.5   (= max(-min, max) / ((q_max - q_min) / 2), q in [-128, 127])
    q     = clamp(round_half_even(w * (1 / scale)), -128, 127),   zero point 0
    w'    = q * scale

(the scale floored at float32's epsilon, as the observer does). Their other
half, 7-bit affine activations calibrated on each client's share of the test
set, is not done here (docs/methods/fens.md, Departures).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from osfl.fl.upload import TensorSpec, UploadSpec
from osfl.methods.clients import model_upload_spec

__all__ = ["SCALE", "dequantize_int8", "int8_spec", "quantize_int8", "quantized_keys"]

SCALE = ".int8_scale"  # suffix of a quantised tensor's scale in an upload
Q_MIN, Q_MAX = -128, 127
#: The layers whose weight eager-mode static quantisation turns to INT8.
QUANTIZED_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)
_EPS = torch.finfo(torch.float32).eps


def quantized_keys(model: nn.Module) -> tuple[str, ...]:
    """The state-dict keys of the weights INT8 covers: ``<layer>.weight`` of
    every convolution and linear layer (a ``meta``-device model will do)."""
    return tuple(
        f"{name}.weight" if name else "weight"
        for name, m in model.named_modules()
        if isinstance(m, QUANTIZED_LAYERS) and isinstance(getattr(m, "weight", None), torch.Tensor)
    )


def int8_scale(w: torch.Tensor) -> torch.Tensor:
    """The per-tensor symmetric scale of ``w`` (float32, shape ``(1,)``)."""
    amax = w.detach().float().abs().max()
    return torch.clamp(amax / ((Q_MAX - Q_MIN) / 2), min=_EPS).reshape(1)


def quantize_int8(
    state: Mapping[str, torch.Tensor], keys: Iterable[str]
) -> dict[str, torch.Tensor]:
    """``state`` with each tensor of ``keys`` as INT8 plus its float32 scale
    under ``<key>.int8_scale``; the other tensors as they are."""
    out = dict(state)
    for k in keys:
        w = state[k].detach().float()
        scale = int8_scale(w)
        out[k] = torch.round(w * (1.0 / scale)).clamp(Q_MIN, Q_MAX).to(torch.int8)
        out[k + SCALE] = scale
    return out


def dequantize_int8(
    tensors: Mapping[str, torch.Tensor], keys: Iterable[str]
) -> dict[str, torch.Tensor]:
    """The float32 state dict an INT8 upload stands for (``q * scale`` for
    ``keys``; the other tensors as they are, the scales dropped)."""
    keys = set(keys)
    return {
        k: tensors[k].float() * tensors[k + SCALE] if k in keys else v
        for k, v in tensors.items()
        if not k.endswith(SCALE)
    }


def int8_spec(reference: Mapping[str, torch.Tensor], keys: Iterable[str]) -> UploadSpec:
    """The upload spec of ``reference`` with ``keys`` as INT8 and their scales."""
    spec = model_upload_spec(reference)
    tensors = dict(spec.tensors)
    for k in keys:
        tensors[k] = TensorSpec(
            tuple(reference[k].shape), torch.int8, finite=False, low=Q_MIN, high=Q_MAX
        )
        tensors[k + SCALE] = TensorSpec((1,), torch.float32, low=0.0)
    return UploadSpec(tensors=tensors, meta=spec.meta)
