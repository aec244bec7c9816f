"""FAFI's server side: informative feature fused inference (IFFI).

Zeng et al., ICML 2025, §4.3 and Appendix C (Algorithm 1):

* global prototypes ``P_g = 1/M sum_m P_m`` (:func:`global_prototypes`);
* per client and test sample, ``alpha_m = 1 - cos(F_m(x), F_m(eps))`` with
  ``eps ~ N(mu, sigma)`` (Eq. 8, :func:`iffi_weights`): an extractor whose
  feature of ``x`` looks like its feature of noise knows little about ``x``;
* the fused feature ``sum_m alpha_m / sum_v alpha_v F_m(x)`` (Eq. 9,
  :func:`fuse`);
* the prediction ``argmax_c cos(F_fused, P_g,c)`` (Eq. 10).

The public code's weighting is a no-op and its test images are unnormalised
(docs/design.md §8); here the noise is drawn once, seeded, in the *normalised*
input space the predictor receives, and the weights are per client and per
sample. ``fusion="average"`` is the plain mean (the paper's Table 9 "Average"
row and Table 3's IFFI-off ablation); other noise parameters are the other
rows of Table 9. ``fusion="data_size"`` weights client m by its share of the
training samples, the public code's ``WEnsembleFeature`` (with
``aggregated_by_datasize``), which is what its evaluation actually runs.
``fusion="median"`` (not in the paper) is the robust variant: the
coordinate-wise median of the clients' features and of their prototypes, so
one hostile extractor (sign-flipped or boosted weights that pass every
screen) moves neither far (docs/robustness.md). A prototype row is a median
only where it can be one: a class with at least :data:`MEDIAN_MIN_HOLDERS`
(3) holders gets the median over them, which one hostile holder cannot drag
outside the honest rows' range. A *holder* is a client that trained on the
class: its upload's ``meta.class_counts`` (validated: C non-negative
integers summing to ``num_samples``) is positive there. A non-zero row is
no sign of holding: with learned prototypes (the default) every client sends
a trained row for every class. With one or two holders a median is no
defence (the median of two rows is their mean: an attacker that claims a
class one honest client holds flips it), so such a class gets the mean of
its holders, is *not* protected, and the server's aggregation names it in a
warning that the run's record keeps (:func:`unprotected_classes`).

Scoring (``SCORINGS``): ``cosine`` is Eq. 10; ``unit_feature`` is the public
code's ``eval_with_proto``: the normalised fused feature · the *raw* mean
prototypes, so a prototype's norm acts as a per-class logit scale.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import Predictor

FUSIONS = ("iffi", "average", "data_size", "median")
#: Holders a class needs before its prototype is a median (below: their mean).
MEDIAN_MIN_HOLDERS = 3
SCORINGS = ("cosine", "unit_feature")

log = logging.getLogger(__name__)


def global_prototypes(prototypes: Sequence[torch.Tensor]) -> torch.Tensor:
    """Algorithm 1's ``P_g``: the plain mean of the clients' C×D prototypes."""
    if not prototypes:
        raise ValueError("no client prototypes to aggregate")
    return torch.stack([p.float() for p in prototypes]).mean(0)


def holders_of(class_counts: torch.Tensor) -> torch.Tensor:
    """M×C: whether client m trained on class c (its ``class_counts`` row is positive)."""
    return torch.as_tensor(class_counts) > 0


def unprotected_classes(class_counts: torch.Tensor) -> list[int]:
    """The classes some client holds but fewer than :data:`MEDIAN_MIN_HOLDERS`
    do: ``fusion="median"`` gives them their holders' mean, which one hostile
    holder moves."""
    n = holders_of(class_counts).sum(0)
    return [c for c in range(len(n)) if 0 < int(n[c]) < MEDIAN_MIN_HOLDERS]


def median_prototypes(
    prototypes: Sequence[torch.Tensor], class_counts: torch.Tensor
) -> torch.Tensor:
    """``fusion="median"``'s prototypes: per class, the coordinate-wise median
    over its holders (M×C ``class_counts`` > 0) when there are at least
    :data:`MEDIAN_MIN_HOLDERS` of them, else their mean (not protected:
    :func:`unprotected_classes`); a class no client holds keeps a zero row."""
    if not prototypes:
        raise ValueError("no client prototypes to aggregate")
    stack = torch.stack([p.float() for p in prototypes])  # M×C×D
    held = holders_of(class_counts)
    if tuple(held.shape) != tuple(stack.shape[:2]):
        raise ValueError(
            f"class counts of shape {tuple(held.shape)} do not match {len(prototypes)} clients' "
            f"{stack.shape[1]} prototype rows"
        )
    rows = []
    for c in range(stack.shape[1]):
        rows_c = stack[held[:, c], c]
        if len(rows_c) >= MEDIAN_MIN_HOLDERS:
            rows.append(torch.quantile(rows_c, 0.5, dim=0))
        elif len(rows_c):
            rows.append(rows_c.mean(0))
        else:
            rows.append(stack.new_zeros(stack.shape[-1]))
    return torch.stack(rows)


def warn_unprotected(class_counts: torch.Tensor) -> list[int]:
    """Log (for the run's record: the server's warnings while it aggregates)
    the classes :func:`median_prototypes` cannot protect; returns them."""
    weak = unprotected_classes(class_counts)
    if weak:
        log.warning(
            "fusion=median: classes %s have fewer than %d holders, so their prototypes are "
            "the holders' mean and one hostile client can move them",
            weak,
            MEDIAN_MIN_HOLDERS,
        )
    return weak


def iffi_weights(feats: torch.Tensor, noise_feats: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ``alpha[m, b] = 1 - cos(feats[m, b], noise_feats[m])``.

    ``feats`` is M×B×D (client m's feature of sample b), ``noise_feats`` M×D
    (client m's feature of the noise). Values lie in [0, 2].
    """
    cos = F.cosine_similarity(feats.float(), noise_feats.float()[:, None, :], dim=-1)
    return 1.0 - cos


def fuse(feats: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 9: the ``weights``-weighted mean over clients of M×B×D features (B×D).

    ``weights`` is M×B (``None``: equal). A sample whose weights all vanish
    (every extractor sees it as noise) falls back to the plain mean.
    """
    if weights is None:
        return feats.float().mean(0)
    w = weights.float()
    total = w.sum(0, keepdim=True)
    w = torch.where(total > 0, w / total.clamp(min=torch.finfo(w.dtype).tiny), 1.0 / w.shape[0])
    return (w[..., None] * feats.float()).sum(0)


@dataclass(frozen=True)
class NoiseSpec:
    """``samples`` images of ``N(mean, std)`` noise, drawn from ``seed`` alone (Eq. 8's eps).

    Also FAFI's option group ``noise`` (``method.fafi.noise.std=5``: a Table 9
    row), where ``seed: null`` means the run's own noise seed. Drawn lazily by
    :class:`IFFIPredictor` at the shape of the first batch it sees, so the
    server needs no knowledge of the evaluation resolution.
    """

    #: mean of the Gaussian noise images
    mean: float = 0.0
    #: standard deviation of the noise images
    std: float = 1.0
    #: noise images drawn (each client's noise feature is their mean)
    samples: int = 1
    #: seed of the noise draw (null: derived from the run seed)
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"noise.samples must be an integer >= 1, got {self.samples!r}")
        if not (self.std >= 0 and math.isfinite(self.std) and math.isfinite(self.mean)):
            raise ConfigError(
                f"noise.std must be finite and >= 0 and noise.mean finite, got "
                f"N({self.mean}, {self.std})"
            )

    def draw(self, shape: Sequence[int]) -> torch.Tensor:
        if self.seed is None:
            raise ValueError("NoiseSpec.seed is unset: give the noise a seed before drawing it")
        gen = torch.Generator().manual_seed(self.seed)
        return self.mean + self.std * torch.randn((self.samples, *shape), generator=gen)


def _check_choices(
    fusion: str,
    scoring: str,
    noise: torch.Tensor | NoiseSpec | None,
    extractors: Sequence[nn.Module],
) -> None:
    """A registered fusion and scoring, noise for IFFI (Eq. 8 weighs by the
    noise features) and at least one extractor."""
    if fusion not in FUSIONS:
        raise ConfigError(f"fafi: fusion must be one of {', '.join(FUSIONS)}; got {fusion!r}")
    if scoring not in SCORINGS:
        raise ConfigError(f"fafi: scoring must be one of {', '.join(SCORINGS)}; got {scoring!r}")
    if fusion == "iffi" and noise is None:
        raise ValueError("IFFI fusion needs noise images or a NoiseSpec")
    if not extractors:
        raise ValueError("IFFIPredictor needs at least one extractor")


def _check_client_weights(client_weights: Sequence[float] | None, num_extractors: int) -> None:
    """``fusion="data_size"``'s weights: one per extractor, finite, >= 0 and
    not all 0 (they are normalised by their sum)."""
    if client_weights is None or len(client_weights) != num_extractors:
        raise ValueError("fusion='data_size' needs one client weight per extractor")
    if any(not (w >= 0 and math.isfinite(w)) for w in client_weights) or not sum(client_weights):
        raise ValueError(f"client weights must be finite, >= 0, not all 0: {client_weights}")


class IFFIPredictor(Predictor):
    """Eq. 8–10 over M client extractors (each: transformed images -> B×D).

    ``noise`` is either fixed images (K×C×H×W, already in the normalised
    input space) or a :class:`NoiseSpec` drawn at the first batch's image
    shape; either way it is fixed from then on, so the prediction of a sample
    does not depend on its batch. Each client's noise feature is the mean of
    its features of the K noise images (K = 1 is the paper's single draw).
    ``normalize_features`` L2-normalises each client feature before fusing
    (not in the paper; it keeps an extractor with large feature norms from
    dominating when architectures differ). ``client_weights`` (M values,
    e.g. sample counts) are the fixed weights of ``fusion="data_size"``.
    ``scoring`` compares the fused feature with the global prototypes
    (``SCORINGS``; ``cosine`` is Eq. 10).
    """

    def __init__(
        self,
        extractors: Sequence[nn.Module],
        prototypes: torch.Tensor,
        *,
        fusion: str = "iffi",
        noise: torch.Tensor | NoiseSpec | None = None,
        normalize_features: bool = False,
        client_weights: Sequence[float] | None = None,
        scoring: str = "cosine",
    ):
        super().__init__()
        _check_choices(fusion, scoring, noise, extractors)
        if fusion == "data_size":
            _check_client_weights(client_weights, len(extractors))
        self.extractors = nn.ModuleList(extractors)
        self.fusion = fusion
        self.scoring = scoring
        self.normalize_features = normalize_features
        self.client_weights = None if client_weights is None else [float(w) for w in client_weights]
        self.noise_spec = noise if isinstance(noise, NoiseSpec) else None
        fixed = noise.detach().float().clone() if isinstance(noise, torch.Tensor) else None
        self.register_buffer("prototypes", prototypes.detach().float().clone())
        self.register_buffer("noise", fixed)
        self._noise_feats: torch.Tensor | None = None
        self.last_weights: torch.Tensor | None = None  # M×B of the last batch, for inspection

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.stack([e(x).float() for e in self.extractors])
        if feats.ndim != 3 or feats.shape[-1] != self.prototypes.shape[1]:
            raise ValueError(
                f"extractors give features of shape {tuple(feats.shape[1:])}, but the "
                f"prototypes have dimension {self.prototypes.shape[1]}"
            )
        return F.normalize(feats, dim=-1) if self.normalize_features else feats

    def noise_features(self, like: torch.Tensor | None = None) -> torch.Tensor:
        """M×D: each client's mean feature of the noise images (computed once).

        ``like`` (a batch) gives the image shape when the noise is still to be drawn.
        """
        if self.noise is None:
            if self.noise_spec is None or like is None:
                raise ValueError("no noise to compute noise features from")
            self.noise = self.noise_spec.draw(like.shape[1:]).to(like.device)
        if self._noise_feats is None or self._noise_feats.device != self.prototypes.device:
            with torch.no_grad():
                self._noise_feats = self._features(self.noise).mean(1)
        return self._noise_feats

    def fused_features(self, x: torch.Tensor) -> torch.Tensor:
        """B×D fused features of a transformed batch (Eq. 8–9; ``median``:
        the coordinate-wise median over the clients)."""
        feats = self._features(x)
        if self.fusion == "median":
            self.last_weights = None
            return torch.quantile(feats, 0.5, dim=0)
        weights = None
        if self.fusion == "iffi":
            weights = iffi_weights(feats, self.noise_features(x))
        elif self.fusion == "data_size":
            assert self.client_weights is not None
            w = torch.tensor(self.client_weights, device=feats.device)
            weights = w[:, None].expand(feats.shape[0], feats.shape[1])
        self.last_weights = weights
        return fuse(feats, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """B×C scores against the global prototypes (Eq. 10 takes the argmax of
        the cosines; ``unit_feature``: dot products with the raw prototypes)."""
        fused = F.normalize(self.fused_features(x), dim=1)
        protos = (
            self.prototypes
            if self.scoring == "unit_feature"
            else F.normalize(self.prototypes, dim=1)
        )
        return fused @ protos.T

    def train(self, mode: bool = True) -> IFFIPredictor:
        self._noise_feats = None  # BN statistics may change with the mode
        return super().train(mode)


def draw_noise(
    shape: tuple[int, int, int], *, samples: int = 1, mean: float = 0.0, std: float = 1.0, seed: int
) -> torch.Tensor:
    """``samples`` noise images ``N(mean, std)`` of ``shape`` (C, H, W), from ``seed`` alone."""
    return NoiseSpec(mean=mean, std=std, samples=samples, seed=seed).draw(shape)
