"""FALCON (Liu et al., "Feature-Aware One-Shot Federated Learning via
Hierarchical Token Sequences", 2025): hierarchical token sequences from a
frozen encoder (:mod:`osfl.methods.frozen`), the M-AR generator and its AR /
NAR ablations (:mod:`.generator`), the attention-pooling classifier
(:mod:`.classifier`), the upload choice (:mod:`.upload`) and the method
``falcon`` (:mod:`.method`, with its options in :mod:`.config`, what every
party builds in :mod:`.base`, the upload's screen in :mod:`.screening`, the
server in :mod:`.server` and its loss in :mod:`.distill`). See
docs/methods/falcon.md.
"""

from osfl.methods.falcon.classifier import AttentionPoolClassifier, ClassifierConfig
from osfl.methods.falcon.config import FALCONConfig
from osfl.methods.falcon.distill import distillation_loss, teacher_probs
from osfl.methods.falcon.generator import (
    LAYOUTS,
    GeneratorConfig,
    SequenceGenerator,
    gmm_log_prob,
    sample_gmm,
)
from osfl.methods.falcon.method import FALCON
from osfl.methods.falcon.mmd import median_bandwidth, mmd2
from osfl.methods.falcon.upload import choose_form, pick_smaller, synthetic_counts

__all__ = [
    "FALCON",
    "LAYOUTS",
    "AttentionPoolClassifier",
    "ClassifierConfig",
    "FALCONConfig",
    "GeneratorConfig",
    "SequenceGenerator",
    "choose_form",
    "distillation_loss",
    "gmm_log_prob",
    "median_bandwidth",
    "mmd2",
    "pick_smaller",
    "sample_gmm",
    "synthetic_counts",
    "teacher_probs",
]
