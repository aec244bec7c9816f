"""Class-conditional synthesis with a server-side prior, then ensemble distillation.

The generative-prior regime of one-shot FL (:mod:`osfl.fl.regimes`): FedLMG
(Yang et al., "Exploring One-shot Semi-supervised Federated Learning with
A Pre-trained Diffusion Model", 2023), OSCAR (Zaland et al., 2025), FedDEO
(Yang et al., ACM MM 2024) and FGL (Yang et al., 2024) all put a pretrained
text-to-image diffusion model on the server and synthesise the data it lacks,
then train the server model on it. They differ in what steers the generator
(class names, client-uploaded descriptions or embeddings, client-model
guidance); what they share is built here, method ``priorkd``:

1. clients train and upload their models once (the shared, cached client
   step, like FedAvg and Ensemble);
2. the server asks the prior (:mod:`osfl.methods.generative.prior`) for
   ``per_class`` images of each class *by its name*;
3. it distils the clients' ensemble into the student on those images exactly
   as FedDF does on public data (Lin et al., NeurIPS 2020): KL between the
   ensemble's and the student's softmax, Adam with cosine annealing, the
   student starting from the clients' FedAvg.

Not built: FedLMG's client-model guidance of the sampler, OSCAR's
client-side captions, FedDEO's per-client descriptions: they need a real
diffusion pipeline to mean anything, which this machine does not have. The
prior is an interface (a tiny stand-in in the tests); without one the method
stops before any client trains.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, register_method
from osfl.methods.generative.prior import load_prior
from osfl.methods.kd.base import WEAK_FEDAVG_TASK, ServerSide
from osfl.methods.kd.feddf import FedDF, FedDFConfig

__all__ = ["PriorKD", "PriorKDConfig"]


@dataclass(frozen=True)
class PriorKDConfig(FedDFConfig):
    """FedDF's server recipe on images from ``prior`` (``per_class`` of each class);
    ``public`` is not used."""

    #: the server's image generator: diffusers:<dir> or dataset:<data spec> (required)
    prior: str = ""
    #: images synthesised per class
    per_class: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.per_class < 1:
            raise ConfigError(f"method.priorkd: per_class must be >= 1, got {self.per_class}")


@register_method("priorkd")
class PriorKD(FedDF):
    """Ensemble distillation on images a server-side prior synthesises from class names."""

    card: ClassVar[MethodCard] = dataclasses.replace(
        FedDF.card,
        summary=(
            "The server synthesises images from class names with a generative prior you provide, "
            "then distils the clients."
        ),
        paper=(
            "the FedLMG / OSCAR / FedDEO pattern (Yang et al. 2023; Zaland et al. 2025; Yang et "
            "al., ACM MM 2024)"
        ),
        regime="generative_prior",
        smoke=(
            *WEAK_FEDAVG_TASK,
            "method.priorkd.prior=dataset:digits",  # the stand-in: real digits by class name
            "method.priorkd.per_class=30",
            "method.priorkd.distill.steps=60",
        ),
    )
    Config: ClassVar[type] = PriorKDConfig

    def check(self) -> None:
        """Refuse a run without a usable prior, or without class names, before training."""
        load_prior(self.config.prior, method=self.name)
        if not self.run.classes:
            raise ConfigError(
                "priorkd prompts its prior with the class names, and this data set has none"
            )

    def transfer_set(self, side: ServerSide) -> ImageSet:
        c, h, _ = side.image_shape
        prior = load_prior(self.config.prior, method=self.name)
        with side.timer.phase("synthesis"):
            images = prior.generate(
                list(self.run.classes),
                self.config.per_class,
                image_size=h,
                channels=c,
                seed=side.seed("prior"),
            )
        side.artifacts["synthetic_images"] = images.images[: 8 * len(self.run.classes)]
        return images
