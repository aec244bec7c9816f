"""FALCON's server distillation loss (Liu et al., "Feature-Aware One-Shot
Federated Learning via Hierarchical Token Sequences", 2025, Eqs. 10–13): the
uniform teacher ensemble and (1−α)·CE + α·T²·KL(p_T ‖ p_S). Kept apart from
the server's loop so that the equations can be read (and tested) alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def distillation_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_probs: torch.Tensor | None,
    alpha: float,
    temperature: float,
) -> torch.Tensor:
    """Eq. 13: (1−α)·CE(z_S, y) + α·T²·KL(p_T ‖ softmax(z_S/T)) (Eqs. 11–12);
    ``teacher_probs=None`` or α = 0 is CE only (the w/o-KD ablation)."""
    ce = F.cross_entropy(logits.float(), labels)
    if teacher_probs is None or alpha == 0.0:
        return ce
    log_s = F.log_softmax(logits.float() / temperature, dim=-1)
    p = teacher_probs.float()
    kl = (torch.xlogy(p, p) - p * log_s).sum(-1).mean()
    return (1 - alpha) * ce + alpha * temperature**2 * kl


def teacher_probs(
    teachers: list[nn.Module], x: torch.Tensor, temperature: float, batch_size: int = 1024
) -> torch.Tensor:
    """Eq. 10: p_T = (1/N) Σ_n softmax(z_n(x)/T), uniform over the clients
    (not weighted by their sizes: a public-code defect)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i : i + batch_size]
            probs = [F.softmax(t(xb).float() / temperature, dim=-1) for t in teachers]
            out.append(torch.stack(probs).mean(0))
    return torch.cat(out)
