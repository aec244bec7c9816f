"""FAFI's self-alignment local training (SALT) losses.

Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025, §4.2:

* :func:`contrastive_loss` — Eq. 4, the feature-alignment loss ``L_ssl`` on
  two augmented views. The positives of an anchor are the samples with its
  label (``x_i^+``), the other view of itself included; the paper's
  denominator runs over the samples of *other* labels only (``N_g(y_i)``).
  ``denominator="all"`` gives the SupCon form [Khosla et al., NeurIPS 2020]
  (every sample but the anchor), which the public code uses. Without labels
  the positive is the other view only (SimCLR / NT-Xent).
* :func:`prototype_loss` — Eq. 5, ``L_proto``: each feature against the
  learnable class prototypes, again with a negatives-only denominator
  (``[C \\ y_i]``) by default and plain softmax cross-entropy as the option.
  Similarity is cosine (the paper's §4.2 and Eq. 10 measure features against
  prototypes by cosine; with raw dot products the negatives-only form is
  unbounded below).
* :func:`prototype_separation_loss` — the public code's extra term that keeps
  the prototypes apart: each prototype must classify as itself against the
  others.

Similarities (``SIMILARITIES``): ``cosine`` (the paper), ``unit_feature``
(L2-normalised feature · *raw* prototype, the public code's
``LearnableProtoResNet``: the prototype norm is a learned per-class logit
scale) and ``dot`` (raw · raw). The last two are unbounded below with the
negatives-only denominator, so they need ``denominator="all"``.

Every loss averages the per-anchor terms of the anchors for which it is
defined (at least one positive and one denominator term); an anchor without
them (a one-class batch under ``denominator="negatives"``) adds nothing, and a
batch with no such anchor gives an exact zero that still carries the graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from osfl.data.transforms import device_path
from osfl.errors import ConfigError

DENOMINATORS = ("negatives", "all")
SIMILARITIES = ("cosine", "unit_feature", "dot")


def _check(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"fafi: {name} must be one of {', '.join(valid)}; got {value!r}")


def _masked_mean_nll(logits: torch.Tensor, pos: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``mean_i [ -1/|P_i| sum_{p in P_i} (l_ip - logsumexp_{j in D_i} l_ij) ]``.

    ``pos`` / ``den`` are boolean masks the shape of ``logits``; rows lacking a
    positive or a denominator term are left out of the mean.

    On the CPU the rows are selected by boolean indexing, as always (the same
    bits as before). On the device path
    (:func:`osfl.data.transforms.device_path`) the mean is a masked sum over a
    count, with no ``bool(...)`` and no boolean index: each would copy a value
    to the host and wait for the GPU (twice per SALT step each). Same value up
    to the order of the sum; a batch with no valid row still gives a zero that
    carries the graph.
    """
    neg_inf = torch.finfo(logits.dtype).min
    lse = torch.logsumexp(logits.masked_fill(~den, neg_inf), dim=1)
    n_pos = pos.sum(1)
    valid = (n_pos > 0) & den.any(1)
    if device_path(logits.device):
        pos_logit = (logits * pos).sum(1) / n_pos.clamp(min=1)
        kept = torch.where(valid, lse - pos_logit, 0.0)
        return kept.sum() / valid.sum().clamp(min=1)
    if not bool(valid.any()):
        return logits.sum() * 0.0
    pos_logit = (logits * pos).sum(1) / n_pos.clamp(min=1)
    per_anchor = lse - pos_logit
    return per_anchor[valid].mean()


def contrastive_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    tau: float = 0.5,
    denominator: str = "negatives",
) -> torch.Tensor:
    """FAFI Eq. 4 on two views ``z1``, ``z2`` (each B×D; row i of both is sample i).

    The 2B features are compared by cosine / ``tau``. With ``labels`` the
    positives of an anchor are every other feature of the same label (the
    supervised form the paper writes); with ``labels=None`` only the other
    view of the same image. ``denominator="negatives"`` sums over the
    features that are not positives (Eq. 4 as written); ``"all"`` over every
    feature but the anchor (SupCon).
    """
    _check("ssl_denominator", denominator, DENOMINATORS)
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"views must both be B×D, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    logits = z @ z.T / tau
    if labels is None:
        ids = torch.arange(b, device=z.device)
    else:
        if labels.shape != (b,):
            raise ValueError(f"labels must have shape ({b},), got {tuple(labels.shape)}")
        ids = labels.to(z.device)
    ids = torch.cat([ids, ids])
    eye = torch.eye(2 * b, dtype=torch.bool, device=z.device)
    same = ids[:, None] == ids[None, :]
    pos = same & ~eye
    den = ~same if denominator == "negatives" else ~eye
    return _masked_mean_nll(logits, pos, den)


def prototype_scores(
    feats: torch.Tensor, prototypes: torch.Tensor, *, similarity: str = "cosine"
) -> torch.Tensor:
    """N×C similarities of features (N×D) to prototypes (C×D) (see ``SIMILARITIES``)."""
    _check("proto_similarity", similarity, SIMILARITIES)
    f, p = feats.float(), prototypes.float()
    if similarity in ("cosine", "unit_feature"):
        f = F.normalize(f, dim=1)
    if similarity == "cosine":
        p = F.normalize(p, dim=1)
    return f @ p.T


def prototype_loss(
    feats: torch.Tensor,
    prototypes: torch.Tensor,
    labels: torch.Tensor,
    *,
    tau: float = 0.5,
    denominator: str = "negatives",
    similarity: str = "cosine",
) -> torch.Tensor:
    """FAFI Eq. 5: features (N×D) against class prototypes (C×D), temperature ``tau``.

    ``denominator="negatives"`` is Eq. 5 (the other classes' prototypes only);
    ``"all"`` is softmax cross-entropy over every prototype.
    """
    _check("proto_denominator", denominator, DENOMINATORS)
    if similarity != "cosine" and denominator == "negatives":
        raise ConfigError(
            f"fafi: proto_similarity={similarity!r} with proto_denominator='negatives' is "
            "unbounded below; use proto_similarity='cosine' or proto_denominator='all'"
        )
    c = prototypes.shape[0]
    if c < 2:
        raise ConfigError("fafi: the prototype loss needs at least 2 classes")
    logits = prototype_scores(feats, prototypes, similarity=similarity) / tau
    onehot = F.one_hot(labels.to(logits.device), c).bool()
    den = ~onehot if denominator == "negatives" else torch.ones_like(onehot)
    return _masked_mean_nll(logits, onehot, den)


def prototype_separation_loss(
    prototypes: torch.Tensor, *, tau: float = 0.5, normalize: bool = True
) -> torch.Tensor:
    """Keeps prototypes apart: cross-entropy of ``sim(P, P) / tau`` with targets ``0..C-1``.

    ``sim`` is the cosine (``normalize=True``) or the raw ``P·Pᵀ`` of the
    public code's ``Contrastive_proto_loss`` (which also grows the norms, the
    prototypes' logit scale under ``unit_feature`` scoring). Minimal when the
    prototypes are mutually far (each is its own nearest prototype by the
    widest margin); it never touches features.
    """
    p = prototypes.float()
    if normalize:
        p = F.normalize(p, dim=1)
    logits = p @ p.T / tau
    return F.cross_entropy(logits, torch.arange(p.shape[0], device=p.device))
