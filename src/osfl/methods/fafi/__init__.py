"""FAFI (Zeng et al., "Does One-shot Give the Best Shot? Mitigating Model
Inconsistency in One-shot Federated Learning", ICML 2025): self-alignment
local training (SALT, :mod:`.salt`, :mod:`.losses`, :mod:`.client`,
:mod:`.local`) and informative
feature fused inference (IFFI, :mod:`.fusion`, :mod:`.inference`),
registered as the method ``fafi`` (:mod:`.method`, options in
:mod:`.config`); the public code's recipe is the method ``fafi_code``. See
docs/methods/fafi.md.
"""

from osfl.methods.fafi.client import FAFIExtractor, FAFINet, TwoViews
from osfl.methods.fafi.config import FAFICodeConfig, FAFIConfig
from osfl.methods.fafi.fusion import (
    IFFIPredictor,
    NoiseSpec,
    draw_noise,
    fuse,
    global_prototypes,
    iffi_weights,
)
from osfl.methods.fafi.losses import (
    contrastive_loss,
    prototype_loss,
    prototype_scores,
    prototype_separation_loss,
)
from osfl.methods.fafi.method import FAFI, FAFICode
from osfl.methods.fafi.salt import SaltLoss

__all__ = [
    "FAFI",
    "FAFICode",
    "FAFICodeConfig",
    "FAFIConfig",
    "FAFIExtractor",
    "FAFINet",
    "IFFIPredictor",
    "NoiseSpec",
    "SaltLoss",
    "TwoViews",
    "contrastive_loss",
    "draw_noise",
    "fuse",
    "global_prototypes",
    "iffi_weights",
    "prototype_loss",
    "prototype_scores",
    "prototype_separation_loss",
]
