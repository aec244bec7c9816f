"""Gradient inversion in the style of Inverting Gradients, with labels given,
recovered (e.g. by RLU) or optimised jointly.

Geiping, Bauermeister, Dröge & Moeller, "Inverting Gradients — How easy is it
to break privacy in federated learning?", NeurIPS 2020: find images ``x'``
whose gradient matches the observed one in *direction*,

    min_{x'}  1 − <∇_θ L(x', y), g> / (||∇_θ L(x', y)|| ||g||)  +  α TV(x'),

with Adam on the pixels (signed gradients, step decays at 3/8, 5/8, 7/8 of
the iterations) inside the valid pixel box. RLU [Chen & Vikalo, ICML 2024,
§4.9, Appendix B.2.5] runs this with labels recovered by RLU instead of
optimising them jointly (Adam, lr 0.1, TV weight 0.2, batch 9, 24 000
iterations on an untrained ResNet-32).

Label modes:
- ``labels`` given (true labels, or a recovered multiset such as
  ``LabelRecoveryResult.labels()`` — slot ``i`` reconstructs *some* image of
  class ``labels[i]``);
- ``labels=None``: joint optimisation of per-slot label logits with the
  images, DLG/iDLG style [Zhu et al., NeurIPS 2019]: the target of slot ``i``
  is ``softmax(ℓ_i)`` and the loss soft cross-entropy.

The order of a batch is not recoverable, so :func:`match_and_score` pairs
reconstructions with the originals by a minimum-MSE linear assignment before
PSNR/SSIM (as breaching's order-invariant metrics do).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from osfl.errors import ConfigError
from osfl.privacy.metrics import lpips, psnr, ssim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InversionConfig:
    """``iterations``/``lr``/``tv``: Adam steps, its step size and the TV weight
    (RLU B.2.5: lr 0.1, TV 0.2; IG uses 24 000 steps, the CPU configs fewer).
    ``signed``: Adam on the sign of the pixel gradient (IG). ``label_lr``: step
    size of the label logits in joint mode."""

    iterations: int = 2000
    lr: float = 0.1
    tv: float = 0.2
    signed: bool = True
    label_lr: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ConfigError(f"inversion: iterations must be >= 1, got {self.iterations}")
        if not self.lr > 0 or not self.label_lr > 0:
            raise ConfigError("inversion: lr and label_lr must be > 0")
        if self.tv < 0:
            raise ConfigError(f"inversion: tv must be >= 0, got {self.tv}")


@dataclass
class InversionResult:
    """Reconstructed images in [0, 1] (B×C×H×W), the labels used/found, the loss curve."""

    images: torch.Tensor
    labels: torch.Tensor
    losses: list[float] = field(default_factory=list)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV: mean absolute difference of neighbouring pixels (IG's regulariser)."""
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()
    return dx + dy


def cosine_distance(grads: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    """``1 − cos`` between two gradients given as lists of tensors (all layers)."""
    dot = sum((g * t).sum() for g, t in zip(grads, target, strict=True))
    gn = sum(g.pow(2).sum() for g in grads).sqrt()
    tn = sum(t.pow(2).sum() for t in target).sqrt()
    return 1.0 - dot / (gn * tn + 1e-12)


def update_to_gradient(
    model: nn.Module,
    global_state: dict[str, torch.Tensor],
    local_state: dict[str, torch.Tensor],
    lr: float,
    steps: int = 1,
) -> list[torch.Tensor]:
    """``−(θ_local − θ_global) / (η m)`` per trainable parameter, in ``model.parameters()`` order.

    For one SGD step this is exactly the batch's mean gradient; for ``m``
    steps it is their average (what IG attacks with multiple local steps).
    """
    out = []
    for name, _ in model.named_parameters():
        if name not in global_state or name not in local_state:
            raise ConfigError(f"update_to_gradient: parameter {name!r} missing from the states")
        out.append(-(local_state[name].float() - global_state[name].float()) / (lr * steps))
    return out


def invert_gradients(
    model: nn.Module,
    target: Sequence[torch.Tensor],
    shape: tuple[int, int, int, int],
    *,
    labels: torch.Tensor | Sequence[int] | None = None,
    num_classes: int | None = None,
    mean: Sequence[float] = (0.0,),
    std: Sequence[float] = (1.0,),
    config: InversionConfig | None = None,
    device: torch.device | str = "cpu",
) -> InversionResult:
    """Reconstruct a batch of ``shape`` whose gradient matches ``target``.

    ``model`` is the model the gradient was taken at (used in eval mode, its
    weights untouched); ``target`` its gradient, one tensor per parameter in
    ``model.parameters()`` order. Images are optimised in the model's input
    space ``(x − mean)/std`` and kept inside the box of valid pixels.
    ``labels``: one per image, or ``None`` for joint optimisation (then
    ``num_classes`` is needed).
    """
    cfg = config or InversionConfig()
    device = torch.device(device)
    params = [p for p in model.parameters()]
    _check_target(params, target)
    B = shape[0]
    model = model.to(device).eval()
    target = [t.detach().to(device) for t in target]
    m = torch.as_tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    lo, hi = (0.0 - m) / s, (1.0 - m) / s

    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(shape, generator=gen).to(device).requires_grad_(True)
    opt_vars: list[dict] = [{"params": [x], "lr": cfg.lr}]
    joint = labels is None
    if joint:
        label_logits = _label_logits(B, num_classes, gen, device)
        opt_vars.append({"params": [label_logits], "lr": cfg.label_lr})
    else:
        y = _given_labels(labels, B, device)
    opt = torch.optim.Adam(opt_vars)
    milestones = [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    losses: list[float] = []
    for it in range(cfg.iterations):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        task = _soft_label_loss(out, label_logits) if joint else F.cross_entropy(out, y)
        grads = torch.autograd.grad(task, params, create_graph=True)
        loss = cosine_distance(grads, target) + cfg.tv * total_variation(x)
        loss.backward()
        if cfg.signed:
            x.grad.sign_()
        opt.step()
        sched.step()
        with torch.no_grad():
            x.copy_(torch.max(torch.min(x, hi), lo))
        if _logged(it, cfg.iterations):
            losses.append(float(loss.detach()))
    with torch.no_grad():
        images = (x.detach() * s + m).clamp(0, 1).cpu()
        found = label_logits.argmax(dim=1).cpu() if joint else y.cpu()
    return InversionResult(images=images, labels=found, losses=losses)


def _check_target(params: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> None:
    """Refuse a target that is not one tensor per parameter of its shape:
    the cosine distance pairs them in order."""
    if len(target) != len(params):
        raise ConfigError(f"target has {len(target)} tensors, the model {len(params)} parameters")
    for i, (p, t) in enumerate(zip(params, target, strict=True)):
        if tuple(p.shape) != tuple(t.shape):
            raise ConfigError(
                f"target tensor {i} has shape {tuple(t.shape)}, parameter {tuple(p.shape)}"
            )


def _label_logits(
    batch: int, num_classes: int | None, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """The label logits optimised jointly with the images (drawn from ``gen``
    after the images, so a seed gives one start)."""
    if num_classes is None:
        raise ConfigError("joint label optimisation needs num_classes")
    return torch.randn(batch, num_classes, generator=gen).to(device).requires_grad_(True)


def _given_labels(
    labels: torch.Tensor | Sequence[int] | None, batch: int, device: torch.device
) -> torch.Tensor:
    """The known labels, one per image."""
    y = torch.as_tensor(labels, dtype=torch.int64, device=device).view(-1)
    if y.numel() != batch:
        raise ConfigError(f"{y.numel()} labels for a batch of {batch} images")
    return y


def _soft_label_loss(out: torch.Tensor, label_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the softmax of the optimised label logits (the
    joint optimisation's task loss, differentiable in the labels)."""
    return torch.sum(-F.softmax(label_logits, dim=1) * F.log_softmax(out, dim=1), dim=1).mean()


def _logged(it: int, iterations: int) -> bool:
    """Whether iteration ``it``'s loss is kept: about 50 of them, and the last."""
    return it % max(1, iterations // 50) == 0 or it == iterations - 1


def match_and_score(recon: torch.Tensor, truth: torch.Tensor) -> dict[str, float | list[int]]:
    """Pair reconstructions to originals (min-MSE assignment), then mean PSNR/SSIM (+LPIPS)."""
    if recon.shape != truth.shape:
        raise ConfigError(f"shapes differ: {tuple(recon.shape)} vs {tuple(truth.shape)}")
    r, t = recon.float().flatten(1), truth.float().flatten(1)
    cost = torch.cdist(r, t).pow(2).numpy()
    rows, cols = linear_sum_assignment(cost)
    order = np.empty(len(cols), dtype=np.int64)
    order[cols] = rows  # order[j] = reconstruction matched to original j
    matched = recon[torch.as_tensor(order)]
    out: dict[str, float | list[int]] = {
        "psnr": float(psnr(matched, truth).mean()),
        "ssim": float(ssim(matched, truth).mean()),
        "assignment": order.tolist(),
    }
    lp = lpips(matched, truth)
    if lp is not None:
        out["lpips"] = float(lp.mean())
    return out
