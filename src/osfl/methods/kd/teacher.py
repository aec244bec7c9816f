"""The client ensemble as a distillation teacher.

Every data-free one-shot method distils the same thing: a weighted average of
the locally trained client models' outputs (Lin et al., FedDF, NeurIPS 2020;
Zhang et al., DENSE, NeurIPS 2022; Dai et al., Co-Boosting, ICLR 2024). The
weights are

- fixed: uniform (DENSE's ``Ensemble_A``), or proportional to the clients'
  sample counts;
- learned (Co-Boosting's ``WEnsemble``): one non-negative weight per client,
  ``logits = sum_k w_k f_k(x) / sum_k w_k``, updated on the synthetic pool
  (see :func:`osfl.methods.kd.coboosting.boost_ensemble_weights`);
- class-level (FedFTG): one weight per (client, class) — client k's share of
  the training samples of class y — selected by each sample's label.

``combine="logits"`` averages logits (DENSE, Co-Boosting, FedMITR's ``E_S``);
``combine="probs"`` averages softmax probabilities and returns their log, so
the output is still a logit vector whose softmax is the probability mixture
(FedDF's and FedFTG's student targets).

The members are frozen (``requires_grad=False``) and in eval mode, but
gradients still flow to the *input*, which is what synthesis needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.clients import WEIGHTINGS

__all__ = ["COMBINES", "EnsembleTeacher"]

COMBINES = ("logits", "probs")


def _as_weights(
    weights: torch.Tensor | Sequence[float] | np.ndarray | None, m: int
) -> torch.Tensor:
    w = (
        torch.full((m,), 1.0 / m)
        if weights is None
        else torch.as_tensor(np.asarray(weights, dtype=np.float32))
    )
    if w.shape != (m,) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ConfigError(
            f"ensemble weights must be {m} finite non-negative numbers, got {w.tolist()}"
        )
    if float(w.sum()) <= 0:
        raise ConfigError("ensemble weights must not all be zero")
    return w.float()


class EnsembleTeacher(nn.Module):
    """Weighted average of client models' outputs.

    ``weights`` (M,) are normalised at use, so only their ratios matter and a
    learned weight vector may leave the simplex. ``class_weights`` (M, K),
    when given, replaces them for samples whose label is passed to
    :meth:`forward`: sample b of class y gets ``class_weights[:, y]``
    (normalised over the clients; a class no client holds falls back to
    ``weights``).
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        weights: torch.Tensor | Sequence[float] | np.ndarray | None = None,
        *,
        class_weights: torch.Tensor | np.ndarray | None = None,
        combine: str = "logits",
    ):
        super().__init__()
        if not models:
            raise ConfigError("an ensemble teacher needs at least one client model")
        if combine not in COMBINES:
            raise ConfigError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
        self.members = nn.ModuleList(models)
        for p in self.members.parameters():
            p.requires_grad_(False)
        self.members.eval()
        self.combine_mode = combine
        self.register_buffer("weights", _as_weights(weights, len(models)))
        if class_weights is not None:
            cw = torch.as_tensor(np.asarray(class_weights, dtype=np.float32))
            if cw.ndim != 2 or cw.shape[0] != len(models) or bool((cw < 0).any()):
                raise ConfigError(
                    f"class_weights must be a non-negative ({len(models)}, num_classes) array, "
                    f"got shape {tuple(cw.shape)}"
                )
            self.register_buffer("class_weights", cw)
        else:
            self.class_weights = None

    # --- construction helpers --------------------------------------------------
    @classmethod
    def from_counts(
        cls,
        models: Sequence[nn.Module],
        num_samples: Sequence[int],
        weighting: str = "uniform",
        **kwargs: object,
    ) -> EnsembleTeacher:
        """Weights from the shared client-weighting registry (``uniform``, ``data_size``)."""
        w = WEIGHTINGS.get(weighting)(list(num_samples))
        return cls(models, w, **kwargs)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.members)

    def train(self, mode: bool = True) -> EnsembleTeacher:
        """Members always stay in eval mode (BN running statistics, no dropout)."""
        super().train(False)
        return self

    # --- forward -------------------------------------------------------------------
    def member_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Each client's logits, stacked: (M, B, K)."""
        return torch.stack([m(x).float() for m in self.members])

    def sample_weights(
        self, batch: int, labels: torch.Tensor | None = None, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Normalised per-sample client weights (M, B)."""
        w = self.weights if weights is None else weights
        w = w.float()
        per = (w / w.sum().clamp_min(1e-12)).unsqueeze(1).expand(-1, batch)
        if labels is None or self.class_weights is None:
            return per
        cw = self.class_weights[:, labels]  # (M, B)
        tot = cw.sum(0, keepdim=True)
        has = tot > 0
        return torch.where(has, cw / tot.clamp_min(1e-12), per)

    def combine(
        self,
        member_logits: torch.Tensor,
        labels: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(M, B, K) member logits -> (B, K) ensemble logits.

        ``weights`` overrides the stored weights (Co-Boosting differentiates
        the ensemble loss through a candidate weight vector).
        """
        w = self.sample_weights(member_logits.shape[1], labels, weights).unsqueeze(-1)  # (M,B,1)
        if self.combine_mode == "logits":
            return (w * member_logits).sum(0)
        probs = (w * F.softmax(member_logits, dim=-1)).sum(0)
        return probs.clamp_min(1e-12).log()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.combine(self.member_logits(x), labels)

    def set_weights(self, weights: torch.Tensor | Sequence[float] | np.ndarray) -> None:
        """Replace the client weights (validated, kept on the current device)."""
        w = _as_weights(
            weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, len(self)
        )
        self.weights.copy_(w.to(self.weights.device))
