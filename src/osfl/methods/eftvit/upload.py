"""EFTViT's upload: the balanced patch-features set of one client, and its spec.

One tensor per class the client holds, ``features.<class>`` (n_c × T × D,
float32): the local module's output tokens of one masked image each — the
class token (and any register tokens) first, then the kept patch tokens —
exactly what the global module consumes. The position of every kept patch is
already inside its token (the position embedding is added before the local
blocks), so the server needs no patch indices to run the global module, and
none are sent. The labels *are* the tensor names: no separate label tensor
can disagree with them.

Metadata declares the median sampling: ``threshold`` (m), ``counts`` (the
per-class feature counts, summing to ``num_features``). Its spec
(:class:`SampledCounts`) refuses counts that median sampling cannot produce:
with padding every held class uploads exactly m, without it at most m and
at least one class exactly m. A feature width, token count or row count other
than the run's and the declared ``counts[c]`` is refused by the tensor spec;
a declared class without its tensor by :func:`missing_classes` (the method's
``screen``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from osfl.errors import UploadError
from osfl.fl.upload import MetaSpec, TensorSpec, Upload, UploadSpec

FEATURES = "features."


def feature_key(cls: int) -> str:
    return f"{FEATURES}{cls}"


def class_of(key: str) -> int:
    """``features.7`` -> 7."""
    return int(key[len(FEATURES) :])


def pack_features(
    per_class: Mapping[int, torch.Tensor], num_classes: int, threshold: int
) -> Upload:
    """The upload of a client's balanced features (``{class: n_c × T × D}``)."""
    counts = [int(per_class[c].shape[0]) if c in per_class else 0 for c in range(num_classes)]
    tensors = {
        feature_key(c): per_class[c].detach().to("cpu", torch.float32).contiguous()
        for c in sorted(per_class)
        if per_class[c].shape[0] > 0
    }
    meta = {"num_features": sum(counts), "counts": counts, "threshold": int(threshold)}
    return Upload(tensors=tensors, meta=meta)


def has_features(tensors: Mapping[str, torch.Tensor]) -> bool:
    return any(k.startswith(FEATURES) and v.shape[0] > 0 for k, v in tensors.items())


def unpack_features(tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(features N × T × D, labels N) of one upload, classes in increasing order."""
    keys = sorted((k for k in tensors if k.startswith(FEATURES)), key=class_of)
    if not keys:
        raise UploadError("no features.<class> tensor in the upload", field="features")
    feats = torch.cat([tensors[k] for k in keys])
    labels = torch.cat(
        [torch.full((tensors[k].shape[0],), class_of(k), dtype=torch.int64) for k in keys]
    )
    return feats, labels


def server_histogram(tensors: Mapping[str, torch.Tensor], num_classes: int) -> np.ndarray:
    """Features per class as the server reads them from an upload (its shapes)."""
    out = np.zeros(num_classes, dtype=np.int64)
    for k, v in tensors.items():
        if k.startswith(FEATURES):
            out[class_of(k)] += int(v.shape[0])
    return out


def missing_classes(upload: Upload) -> list[int]:
    """Classes whose declared count is positive but whose tensor is absent (the
    spec ties every present tensor to its count; this is the other direction)."""
    counts = upload.meta.get("counts") or []
    return [c for c, n in enumerate(counts) if n > 0 and feature_key(c) not in upload.tensors]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class SampledCounts(MetaSpec):
    """Per-class counts declared by median sampling with threshold
    ``meta[threshold_key]``: 0 or exactly m per class (``padded``), or at most
    m with some class at m (not padded)."""

    threshold_key: str = "threshold"
    padded: bool = True

    def problem(self, value: Any, meta: Mapping[str, Any]) -> str | None:
        why = super().problem(value, meta)
        if why is not None:
            return why
        m = meta.get(self.threshold_key)
        if not _is_int(m) or m < 1:
            return f"needs meta.{self.threshold_key}, a positive integer, got {m!r}"
        if self.padded:
            bad = [c for c, n in enumerate(value) if n not in (0, m)]
            if bad:
                return (
                    f"class {bad[0]} has {value[bad[0]]} features; padded median sampling "
                    f"uploads 0 or exactly {self.threshold_key}={m} per class"
                )
            return None
        over = [c for c, n in enumerate(value) if n > m]
        if over:
            return (
                f"class {over[0]} has {value[over[0]]} features, more than {self.threshold_key}={m}"
            )
        if m not in value:
            return f"no class reaches {self.threshold_key}={m} (the median class always does)"
        return None


def feature_upload_spec(num_classes: int, tokens: int, width: int, padded: bool) -> UploadSpec:
    """``features.<c>`` (``meta.counts[c]`` × ``tokens`` × ``width``, float32,
    finite) for any class c, and the median-sampling metadata."""
    return UploadSpec(
        optional={
            feature_key(c): TensorSpec((("counts", c), tokens, width), torch.float32)
            for c in range(num_classes)
        },
        meta={
            "num_features": MetaSpec("int", low=1),
            "threshold": MetaSpec("int", low=1),
            "counts": SampledCounts(
                "int_list", low=0, length=num_classes, sum_of="num_features", padded=padded
            ),
        },
    )
