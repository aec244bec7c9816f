"""Token relabel: the server objective of FedMITR (Sec. IV-B, Eq. 8).

Shen et al., "Provable Sparse Inversion and Token Relabel Enhanced One-shot
Federated Learning with ViTs" (FedMITR). On a
synthetic batch ``x`` with its inversion labels ``y`` and the kept-patch mask
of its sparse inversion (kept = "high information density" ``x_h``, stopped
= "low information density" ``x_l``), the server ViT ``f_S`` minimises

    L_KD(E_S(x), f_S(x))                       whole image, Eq. 4 (KL, T = 1)
  + lambda1 · CE(f_S(x_h), y)                  kept patches + class token
  + lambda2 · KL(E_S(x_l), f_S(x_l))           stopped patches, relabelled by the ensemble

``f_S(x_h)`` is the sparse forward on the kept patch tokens (the class token is
always in). The paper does not say how ``x_l`` is fed to the ensemble; the
choice is the option ``low_density_input`` (registry
:data:`LOW_DENSITY_INPUTS`):

- ``sparse`` (default): every client, and the server, run their sparse forward
  on the *stopped* patch indices (+ class token), the same token-subset
  mechanism the inversion used, so ``x_l`` is literally the low-density
  tokens;
- ``masked``: a dense forward of the image whose kept patches are replaced by
  0 in the model-input space (the data mean), for models that cannot take a
  token subset.

The ablations of Tables III / IV are weight settings (registry
:data:`VARIANTS`): ``inversion_kd`` (L_KD only on *dense* inversions: Table
III's "Inversion + KD" row equals Table I's DeepInversion column, 33.25 vs
33.77 on CIFAR-10 Dir(0.1), i.e. ADI; Table IV's "w/ L_KD"), ``inversion_pl``
(CE to the pseudo-labels on the whole image only, sparse inversions as
FedMITR's), ``no_cls`` (lambda1 = 0), ``no_kl`` (lambda2 = 0) and the full
``fedmitr``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.fedmitr.sparse_inversion import Grid, idx_from_keep_mask, pixel_mask
from osfl.methods.kd.distill import Distiller
from osfl.methods.kd.pool import PoolBatch
from osfl.methods.kd.priors import kd_kl
from osfl.methods.kd.teacher import EnsembleTeacher
from osfl.registry import Registry

__all__ = [
    "CLS_FILTERS",
    "LOW_DENSITY_INPUTS",
    "VARIANTS",
    "RelabelWeights",
    "TokenRelabelLoss",
    "Variant",
    "ensemble_on_tokens",
]


@dataclass(frozen=True)
class RelabelWeights:
    """Weights of the terms of Eq. 8 (+ ``pl``: CE on the whole image, the
    "inversion + PL" ablation)."""

    kd: float = 1.0
    cls: float = 0.5
    kl: float = 0.5
    pl: float = 0.0

    def __post_init__(self) -> None:
        vals = (self.kd, self.cls, self.kl, self.pl)
        if any(v < 0 for v in vals) or not any(v > 0 for v in vals):
            raise ConfigError(f"relabel weights must be >= 0 and not all zero, got {vals}")


@dataclass(frozen=True)
class Variant:
    """An ablation of Eq. 8: ``variant(lambda1, lambda2)`` gives its loss weights;
    ``sparse`` says whether its synthesis is FedMITR's sparse inversion (False:
    dense inversion, every patch inverted, no kept-patch masks)."""

    weights: Callable[[float, float], RelabelWeights]
    sparse: bool = True

    def __call__(self, lambda1: float, lambda2: float) -> RelabelWeights:
        return self.weights(lambda1, lambda2)


#: ablation name -> its :class:`Variant`
VARIANTS: Registry[Variant] = Registry("fedmitr variant")
VARIANTS.add("fedmitr", Variant(lambda l1, l2: RelabelWeights(kd=1.0, cls=l1, kl=l2)))
VARIANTS.add(
    "inversion_kd",
    Variant(lambda l1, l2: RelabelWeights(kd=1.0, cls=0.0, kl=0.0), sparse=False),
)
VARIANTS.add(
    "inversion_pl", Variant(lambda l1, l2: RelabelWeights(kd=0.0, cls=0.0, kl=0.0, pl=1.0))
)
VARIANTS.add("no_cls", Variant(lambda l1, l2: RelabelWeights(kd=1.0, cls=0.0, kl=l2)))
VARIANTS.add("no_kl", Variant(lambda l1, l2: RelabelWeights(kd=1.0, cls=l1, kl=0.0)))

#: ``fn(model, x, low_idx, grid) -> logits``: how a model sees the low-density tokens
LowInput = Callable[[nn.Module, torch.Tensor, torch.Tensor, Grid], torch.Tensor]
LOW_DENSITY_INPUTS: Registry[LowInput] = Registry("low-density input")


@LOW_DENSITY_INPUTS.register("sparse")
def _sparse(model: nn.Module, x: torch.Tensor, low_idx: torch.Tensor, grid: Grid) -> torch.Tensor:
    return model(x, keep_idx=low_idx)


@LOW_DENSITY_INPUTS.register("masked")
def _masked(model: nn.Module, x: torch.Tensor, low_idx: torch.Tensor, grid: Grid) -> torch.Tensor:
    gh, gw = grid[0], grid[1]
    low = torch.zeros(x.shape[0], gh * gw, dtype=torch.bool, device=x.device)
    low.scatter_(1, low_idx, True)
    return model(x * pixel_mask(low, grid).to(x.dtype))


def ensemble_on_tokens(
    teacher: EnsembleTeacher, x: torch.Tensor, low_idx: torch.Tensor, grid: Grid, how: str
) -> torch.Tensor:
    """The client ensemble's logits on the low-density tokens (no gradient)."""
    fn = LOW_DENSITY_INPUTS.get(how)
    with torch.no_grad():
        member = torch.stack([fn(m, x, low_idx, grid).float() for m in teacher.members])
        return teacher.combine(member)


#: which synthetic images enter L_CLS: all (Eq. 8), or only those the client ensemble
#: classifies as their pseudo-label (``teacher``; not in the paper, a diagnostic of
#: pseudo-labels that do not match the image, see docs/methods/fedmitr.md)
CLS_FILTERS = ("none", "teacher")


class TokenRelabelLoss:
    """Eq. 8 as a :data:`osfl.methods.kd.distill.LossFn` for part A's
    :class:`~osfl.methods.kd.distill.Distiller` (pool extra ``keep``: (B, N)
    boolean kept-patch mask of each image). ``cls_filter`` (:data:`CLS_FILTERS`)
    restricts L_CLS to the images whose pseudo-label the ensemble agrees with
    (the batch mean over those; zero when there are none)."""

    def __init__(
        self,
        weights: RelabelWeights,
        grid: Grid,
        low_density_input: str = "sparse",
        cls_filter: str = "none",
    ):
        LOW_DENSITY_INPUTS.get(low_density_input)
        if cls_filter not in CLS_FILTERS:
            raise ConfigError(
                f"cls_filter must be one of {', '.join(CLS_FILTERS)}, got {cls_filter!r}"
            )
        self.w = weights
        self.grid = grid
        self.how = low_density_input
        self.cls_filter = cls_filter
        self.last: dict[str, float] = {}

    def __call__(self, distiller: Distiller, batch: PoolBatch, x: torch.Tensor) -> torch.Tensor:
        w, y = self.w, batch.labels
        keep = batch.extras.get("keep")
        terms: dict[str, torch.Tensor] = {}  # in Eq. 8's order: the float sum depends on it
        t_full = self._full_terms(distiller, x, y, terms)
        agreement: float | None = None
        if (w.cls > 0 or w.kl > 0) and keep is None:
            raise ConfigError("token relabel needs the pool's 'keep' masks (sparse inversion)")
        if w.cls > 0 and keep is not None:
            terms["cls"], agreement = self._cls_term(distiller, x, y, keep, t_full)
        if w.kl > 0 and keep is not None and bool((~keep).any()):
            terms["kl"] = self._kl_term(distiller, x, keep)
        self.last = {k: float(v.detach()) for k, v in terms.items()}
        if agreement is not None:
            self.last["cls_agree"] = agreement
        if not terms:
            return x.new_zeros((), requires_grad=True)
        return sum(terms.values())  # type: ignore[return-value]

    def _full_terms(
        self, distiller: Distiller, x: torch.Tensor, y: torch.Tensor, terms: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """L_KD and L_PL on every token (one student pass for both); returns
        the teacher's logits when L_KD computed them, so L_CLS's filter
        reuses them."""
        w = self.w
        t_full: torch.Tensor | None = None
        if w.kd > 0 or w.pl > 0:
            s_full = distiller.student(x)
            if w.kd > 0:
                t_full = distiller.teacher_logits(x)
                terms["kd"] = w.kd * kd_kl(s_full, t_full, 1.0)
            if w.pl > 0:
                terms["pl"] = w.pl * F.cross_entropy(s_full.float(), y)
        return t_full

    def _cls_term(
        self,
        distiller: Distiller,
        x: torch.Tensor,
        y: torch.Tensor,
        keep: torch.Tensor,
        t_full: torch.Tensor | None,
    ) -> tuple[torch.Tensor, float | None]:
        """``(w_cls · L_CLS, agreement)``: the student on the kept
        (high-density) tokens against the pseudo-labels; with
        ``cls_filter="teacher"`` only the images the ensemble agrees with
        count (batch mean over those), ``agreement`` their fraction."""
        hi = idx_from_keep_mask(keep.to(x.device), keep=True)
        ce = F.cross_entropy(distiller.student(x, keep_idx=hi).float(), y, reduction="none")
        agreement: float | None = None
        if self.cls_filter == "teacher":
            if t_full is None:
                with torch.no_grad():
                    t_full = distiller.teacher_logits(x)
            agree = (t_full.argmax(1) == y).to(ce.dtype)
            agreement = float(agree.mean())
            ce = ce * agree * (len(agree) / agree.sum().clamp(min=1))
        return self.w.cls * ce.mean(), agreement

    def _kl_term(self, distiller: Distiller, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``w_kl · L_KL``: the student against the client ensemble on the
        dropped (low-density) tokens."""
        teacher = distiller.teacher
        if not isinstance(teacher, EnsembleTeacher):
            raise ConfigError("the L_KL term needs the client ensemble as teacher")
        lo = idx_from_keep_mask(keep.to(x.device), keep=False)
        t_lo = ensemble_on_tokens(teacher, x, lo, self.grid, self.how)
        s_lo = LOW_DENSITY_INPUTS.get(self.how)(distiller.student, x, lo, self.grid)
        return self.w.kl * kd_kl(s_lo, t_lo, 1.0)
