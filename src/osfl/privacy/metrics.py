"""Scores of privacy attacks: label recovery (cAcc, iAcc) and image
reconstruction (PSNR, SSIM, LPIPS).

Label recovery, exactly as Chen & Vikalo [ICML 2024, Appendix B.4], who follow
iRLG [Ma et al., ICLR 2023]:

- **cAcc** (Eq. 91) = ``|ŷ_c XNOR y_c| / N``: ``y_c`` and ``ŷ_c`` are the
  indicator vectors over the ``N`` classes of "this class occurs in the
  client's batches" (truth) and "this class was recovered"; cAcc is the
  fraction of classes on which they agree (present in both or absent in both).
- **iAcc** (Eq. 92) = ``|ŷ_i ∩ y_i| / (m·|B|)``: the multiset intersection of
  recovered and true labels (``Σ_j min(N̂_j, N_j)``) over the number of labels
  of the ``m`` local steps.

Images: PSNR and SSIM from ``torchmetrics.functional.image`` on [0, 1] images
(data range 1); LPIPS [Zhang et al., CVPR 2018] through torchmetrics only
when its backbone weights are already on disk — torchmetrics would otherwise
download them, which this project never does at run time — else ``None``
with a logged reason.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from osfl.errors import DataError

log = logging.getLogger(__name__)


def _counts(
    x: np.ndarray | torch.Tensor | Sequence[int], num_classes: int, what: str
) -> np.ndarray:
    a = np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise DataError(f"{what} must be a 1-D integer array")
    if a.size and (a.min() < 0 or a.max() >= num_classes):
        raise DataError(f"{what} must lie in [0, {num_classes})")
    return np.bincount(a, minlength=num_classes).astype(np.int64)


def class_accuracy(pred_counts: np.ndarray, true_counts: np.ndarray) -> float:
    """cAcc (Eq. 91): fraction of classes whose presence is recovered correctly."""
    p, t = np.asarray(pred_counts) > 0, np.asarray(true_counts) > 0
    if p.shape != t.shape or p.ndim != 1 or p.size == 0:
        raise DataError("class_accuracy needs two count vectors of the same length")
    return float(np.mean(p == t))


def instance_accuracy(pred_counts: np.ndarray, true_counts: np.ndarray) -> float:
    """iAcc (Eq. 92): ``Σ_j min(N̂_j, N_j) / Σ_j N_j``."""
    p, t = np.asarray(pred_counts, dtype=np.int64), np.asarray(true_counts, dtype=np.int64)
    if p.shape != t.shape or p.ndim != 1:
        raise DataError("instance_accuracy needs two count vectors of the same length")
    total = int(t.sum())
    if total == 0:
        raise DataError("instance_accuracy: the true batch has no labels")
    return float(np.minimum(p, t).sum() / total)


def label_metrics(
    pred_counts: np.ndarray | Sequence[int],
    truth: np.ndarray | torch.Tensor | Sequence[int],
    *,
    num_classes: int,
    truth_is_counts: bool = False,
) -> dict[str, float]:
    """``{"cAcc", "iAcc"}`` of recovered counts against the true labels (or counts)."""
    p = np.asarray(pred_counts, dtype=np.int64)
    if p.shape != (num_classes,):
        raise DataError(f"recovered counts must have shape ({num_classes},), got {p.shape}")
    t = (
        np.asarray(truth, dtype=np.int64)
        if truth_is_counts
        else _counts(truth, num_classes, "truth")
    )
    return {"cAcc": class_accuracy(p, t), "iAcc": instance_accuracy(p, t)}


# ------------------------------------------------------------------ images
def _check_images(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape != y.shape or x.ndim != 4:
        raise DataError(
            f"image metrics need two B×C×H×W batches of equal shape, got {x.shape}, {y.shape}"
        )


def psnr(x: torch.Tensor, y: torch.Tensor, *, per_image: bool = True) -> torch.Tensor:
    """PSNR (dB) of images in [0, 1]; per image (B,) by default, as IG and RLU report."""
    # heavy: torchmetrics (~1 s; only scoring a reconstruction needs it)
    from torchmetrics.functional.image import peak_signal_noise_ratio

    _check_images(x, y)
    x, y = x.float().clamp(0, 1), y.float().clamp(0, 1)
    if not per_image:
        return peak_signal_noise_ratio(x, y, data_range=1.0)
    return torch.stack(
        [
            peak_signal_noise_ratio(a[None], b[None], data_range=1.0)
            for a, b in zip(x, y, strict=True)
        ]
    )


def ssim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SSIM per image (B,) of images in [0, 1] (Gaussian 11×11 window, σ = 1.5)."""
    # heavy: torchmetrics (~1 s; only scoring a reconstruction needs it)
    from torchmetrics.functional.image import structural_similarity_index_measure

    _check_images(x, y)
    x, y = x.float().clamp(0, 1), y.float().clamp(0, 1)
    kernel = min(11, x.shape[-1] - (1 - x.shape[-1] % 2), x.shape[-2] - (1 - x.shape[-2] % 2))
    return structural_similarity_index_measure(
        x, y, data_range=1.0, reduction="none", kernel_size=kernel
    )


@lru_cache(maxsize=1)
def lpips_weights_available(net: str = "alex") -> str | None:
    """Why LPIPS cannot run offline (a message), or ``None`` when its weights are local.

    torchmetrics' LPIPS needs torchvision's backbone weights (torch hub cache)
    and the linear-layer weights shipped with the ``lpips`` package.
    """
    try:
        import torchvision  # noqa: F401  (optional: torchvision, not a dependency of osfl)
    except ImportError:
        return "LPIPS needs torchvision (not a dependency of osfl); skipped"
    hub = (
        Path(os.environ.get("TORCH_HOME", Path.home() / ".cache" / "torch")) / "hub" / "checkpoints"
    )
    prefix = {"alex": "alexnet", "vgg": "vgg16", "squeeze": "squeezenet"}.get(net, net)
    if not hub.exists() or not any(p.name.startswith(prefix) for p in hub.iterdir()):
        return (
            f"LPIPS backbone weights ({prefix}) are not in {hub}; skipped (nothing is downloaded)"
        )
    return None


def lpips(x: torch.Tensor, y: torch.Tensor, *, net: str = "alex") -> torch.Tensor | None:
    """LPIPS per image (B,) when its weights are present locally, else ``None`` (logged)."""
    _check_images(x, y)
    why = lpips_weights_available(net)
    if why is not None:
        log.info(why)
        return None
    # heavy: torchmetrics (~1 s; only scoring a reconstruction needs it)
    from torchmetrics.functional.image.lpips import learned_perceptual_image_patch_similarity

    x, y = x.float().clamp(0, 1), y.float().clamp(0, 1)
    return torch.stack(
        [
            learned_perceptual_image_patch_similarity(
                a[None], b[None], net_type=net, normalize=True
            )
            for a, b in zip(x, y, strict=True)
        ]
    )
