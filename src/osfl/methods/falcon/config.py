"""FALCON's options (Liu et al., "Feature-Aware One-Shot Federated Learning
via Hierarchical Token Sequences", 2025, §3.1 settings, §3.6 upload choice):
the one place their defaults and checks live, so that the client, the screen
and the server read the same values. See docs/methods/falcon.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from osfl.errors import ConfigError
from osfl.fl.tensor_fit import FitConfig
from osfl.methods.falcon.classifier import ClassifierConfig
from osfl.methods.falcon.generator import LAYOUTS, GeneratorConfig
from osfl.methods.falcon.upload import FORMS
from osfl.methods.frozen.encoder import EncoderConfig
from osfl.methods.frozen.views import HSEConfig


def _generator_fit() -> FitConfig:
    """Paper §3.1: AdamW, lr 1e-4, weight decay 1e-4, batch 256, 400 epochs;
    as in the authors' code (``s2_g.py``), gradient clipping at 2.0 (NLL
    stability) and the epoch with the lowest mean loss kept. The clip acts on
    the gradient of :meth:`SequenceGenerator.loss`, the NLL averaged over
    token positions as in their ``nll_loss``."""
    return FitConfig(
        epochs=400,
        batch_size=256,
        optimizer="adamw",
        lr=1e-4,
        weight_decay=1e-4,
        grad_clip=2.0,
        keep="lowest_loss",
    )


#: How the server picks its student's weights (``FALCONConfig.student_selection``).
SELECTIONS = ("last", "validation")
NEEDS_VALIDATION = (
    "method.falcon.student_selection=validation needs a validation set: "
    "set data.validation_fraction (e.g. 0.1)"
)


def _classifier_fit() -> FitConfig:
    """Paper §3.1: Adam, lr 5e-4, batch 256, 60 epochs (local and global classifier)."""
    return FitConfig(epochs=60, batch_size=256, optimizer="adam", lr=5e-4)


@dataclass(frozen=True)
class FALCONConfig:
    """FALCON's options; defaults are the paper's (§3.1), see docs/methods/falcon.md.

    ``upload``: ``auto`` (the smaller of sequences and generator, §3.6),
    ``sequences`` or ``generator`` (forced). ``synthetic_ratio``: synthetic
    sequences per class = ratio × the client's real count of that class
    (at least one for a class it holds; none for a class it lacks); 1.5 as
    the authors' ``s2.5_sample.py`` draws (the paper does not say).
    ``student_selection``: the server student's weights after its ``last``
    epoch, or after the epoch most accurate on the run's ``validation`` set
    (``data.validation_fraction`` > 0), as the authors' ``s3_global_training.py``
    keeps the best student on validation features.
    """

    #: encode region views too (hierarchical sequences); false: the global token only
    hse: bool = True
    #: the sliding-window region views HSE encodes
    views: HSEConfig = field(default_factory=HSEConfig)
    #: how the frozen encoder runs
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    #: token-sequence generator: mar (the paper), ar or nar
    generator: str = "mar"
    #: the generator's architecture
    generator_model: GeneratorConfig = field(default_factory=GeneratorConfig)
    #: how each client trains its generator
    generator_fit: FitConfig = field(default_factory=_generator_fit)
    #: the classifier's architecture
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    #: how each client trains its local classifier
    classifier_fit: FitConfig = field(default_factory=_classifier_fit)
    #: how the server trains the final classifier
    server_fit: FitConfig = field(default_factory=_classifier_fit)
    #: distil the clients' classifiers into the server's (false: cross-entropy on synthetic data
    #: only)
    kd: bool = True
    #: weight of the distillation term against cross-entropy
    alpha: float = 0.5
    #: distillation temperature
    temperature: float = 4.0
    #: synthetic sequences per class, as a multiple of the client's real count of that class
    synthetic_ratio: float = 1.5
    #: what a client sends: auto (the smaller of the two), sequences or generator
    upload: str = "auto"
    #: the server student kept: after its last epoch, or its most accurate epoch on validation
    student_selection: str = "last"

    def __post_init__(self) -> None:
        LAYOUTS.get(self.generator)  # unknown variant -> ConfigError listing the valid ones
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.synthetic_ratio <= 0:
            raise ConfigError(f"synthetic_ratio must be > 0, got {self.synthetic_ratio}")
        if self.student_selection not in SELECTIONS:
            raise ConfigError(
                f"student_selection must be one of {', '.join(SELECTIONS)}; "
                f"got {self.student_selection!r}"
            )
        if self.upload not in ("auto", *FORMS):
            raise ConfigError(
                f"upload must be one of auto, {', '.join(FORMS)}; got {self.upload!r}"
            )
