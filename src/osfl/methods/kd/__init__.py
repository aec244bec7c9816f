"""Data-free distillation for one-shot FL: the shared machinery and the
server-side baselines of FedMITR's tables.

Shared machinery (reusable by any method, FedMITR included):

- :mod:`~osfl.methods.kd.teacher`: :class:`EnsembleTeacher` (uniform,
  data-size, learnable or class-level weighted client logits);
- :mod:`~osfl.methods.kd.distill`: :class:`Distiller` / :class:`DistillConfig`
  (KD-KL at a temperature + CE to pseudo-labels, osfl optimizers/schedules);
- :mod:`~osfl.methods.kd.pool`: :class:`SyntheticPool` (growing, capped);
- :mod:`~osfl.methods.kd.priors`: :class:`BNStatsLoss`, TV / l2 priors, KD-KL,
  JS, adversarial KL, l1 discrepancy;
- :mod:`~osfl.methods.kd.pixels`: :func:`invert` (DeepInversion / ADI / dense
  SMI pixel optimisation, pluggable forward for sparse schemes);
- :mod:`~osfl.methods.kd.generator`: DENSE's :class:`Generator` (+ FedFTG's
  conditional variant);
- :mod:`~osfl.methods.kd.space`: :class:`InputSpace` (normalisation);
- :mod:`~osfl.methods.kd.base`: :class:`DistillationMethod` (client side of
  one-shot FedAvg/Ensemble, server = synthesis + distillation), :class:`KDConfig`.

Methods registered here: ``deepinversion``, ``adi``, ``dense``, ``coboosting``,
``fedftg``, ``feddf``. See docs/methods/kd.md.
"""

from osfl.methods.kd import coboosting, deepinversion, dense, feddf, fedftg  # noqa: F401 (register)
from osfl.methods.kd.augment import AUGMENTS, build_augment
from osfl.methods.kd.base import (
    DistillationMethod,
    KDConfig,
    PhaseTimer,
    ServerSide,
    frozen,
)
from osfl.methods.kd.distill import DistillConfig, Distiller, DistillStats, kd_objective
from osfl.methods.kd.generator import Generator, GeneratorConfig, reset_generator
from osfl.methods.kd.pixels import (
    InversionConfig,
    InversionResult,
    InversionState,
    Jitter,
    invert,
    random_labels,
)
from osfl.methods.kd.pool import PoolBatch, SyntheticPool
from osfl.methods.kd.priors import (
    BNStatsLoss,
    adversarial_kl,
    disagreement_mask,
    js_divergence,
    kd_kl,
    l1_discrepancy,
    l2_prior,
    tv_loss,
)
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher

__all__ = [
    "AUGMENTS",
    "BNStatsLoss",
    "DistillConfig",
    "DistillStats",
    "DistillationMethod",
    "Distiller",
    "EnsembleTeacher",
    "Generator",
    "GeneratorConfig",
    "InputSpace",
    "InversionConfig",
    "InversionResult",
    "InversionState",
    "Jitter",
    "KDConfig",
    "PhaseTimer",
    "PoolBatch",
    "ServerSide",
    "SyntheticPool",
    "adversarial_kl",
    "build_augment",
    "disagreement_mask",
    "frozen",
    "invert",
    "js_divergence",
    "kd_kl",
    "kd_objective",
    "l1_discrepancy",
    "l2_prior",
    "random_labels",
    "reset_generator",
    "tv_loss",
]
