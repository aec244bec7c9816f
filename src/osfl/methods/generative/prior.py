"""Server-side image priors: the interface of the generative-prior regime.

One-shot FL methods of the third regime (FedLMG, OSCAR, FedDEO, FGL: see
:mod:`osfl.fl.regimes`) put a large pretrained generator — in practice a
text-to-image diffusion pipeline of several GB, about 10³ GFLOPs per image —
on the server and synthesise the training data the server lacks. osfl never
downloads one: a user who has a pipeline on disk names it, and without one the
method stops before any client trains.

An :class:`ImagePrior` turns class names into images::

    images = prior.generate(["dog", "ship"], per_class=64, image_size=32,
                            channels=3, seed=0)        # ImageSet, labels 0, 1

``prior`` specs: ``diffusers:<local pipeline dir>`` (a ``diffusers``
``DiffusionPipeline`` saved with ``save_pretrained``, prompted "a photo of a
<class>"; needs ``pip install diffusers``), ``dataset:<data spec>`` (real
images of each class: a perfect generator's upper bound, and the stand-in the
smoke run uses), or a name registered in :data:`PRIORS` by the user's own code
(``register_prior``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from osfl.data.imageset import ImageSet
from osfl.data.sources import load_data
from osfl.errors import ConfigError
from osfl.registry import Registry

__all__ = ["PRIORS", "ImagePrior", "load_prior", "register_prior"]

NO_PRIOR = (
    "{method} needs a server-side image generator: set method.{method}.prior to "
    "diffusers:<local pipeline directory> (pip install diffusers) or to a prior your code "
    "registered with osfl.methods.generative.register_prior; osfl downloads none"
)


class ImagePrior(Protocol):
    """A class-conditional image generator the server holds."""

    def generate(
        self,
        class_names: Sequence[str],
        per_class: int,
        *,
        image_size: int,
        channels: int,
        seed: int,
    ) -> ImageSet:
        """``per_class`` uint8 images of each class at ``image_size`` px, labelled
        by the class's index in ``class_names``; the same seed gives the same images."""
        ...


#: name -> factory(argument after the colon, or "") -> ImagePrior
PRIORS: Registry[Callable[[str], ImagePrior]] = Registry("image prior")


def register_prior(name: str, factory: Callable[[str], ImagePrior]) -> None:
    """Make ``prior: <name>[:<argument>]`` build ``factory(argument)``."""
    PRIORS.add(name, factory)


def load_prior(spec: str, *, method: str) -> ImagePrior:
    """The prior a ``prior`` spec names; a clear ConfigError when none is set or
    its package is missing."""
    if not spec:
        raise ConfigError(NO_PRIOR.format(method=method))
    name, _, arg = spec.partition(":")
    if name not in PRIORS:
        raise ConfigError(
            f"method.{method}.prior: unknown prior {name!r}; known: {', '.join(PRIORS.names())}"
        )
    return PRIORS.get(name)(arg)


class DiffusersPrior:
    """A local ``diffusers`` text-to-image pipeline, prompted "a photo of a <class>"."""

    def __init__(self, directory: str, prompt: str = "a photo of a {}"):
        try:
            import diffusers  # noqa: F401  (optional: diffusers; checked before the directory)
        except ImportError as e:
            raise ConfigError(
                "prior diffusers:<dir> needs the diffusers package (pip install diffusers), "
                "which osfl does not install"
            ) from e
        path = Path(directory)
        if not directory or not path.is_dir():
            raise ConfigError(
                f"prior diffusers:{directory}: not a local pipeline directory (osfl never "
                "downloads weights: save one with DiffusionPipeline.save_pretrained)"
            )
        # optional: diffusers (its pipelines are heavy to import, so only once needed)
        from diffusers import DiffusionPipeline

        self.pipe = DiffusionPipeline.from_pretrained(str(path), local_files_only=True)
        self.prompt = prompt

    def generate(
        self,
        class_names: Sequence[str],
        per_class: int,
        *,
        image_size: int,
        channels: int,
        seed: int,
    ) -> ImageSet:
        images, labels = [], []
        for label, name in enumerate(class_names):
            g = torch.Generator().manual_seed(seed * 1000 + label)
            out = self.pipe(
                self.prompt.format(name), num_images_per_prompt=per_class, generator=g
            ).images
            for img in out:
                arr = np.asarray(img.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
                t = torch.from_numpy(arr.copy()).reshape(arr.shape[0], arr.shape[1], channels)
                images.append(resize_uint8(t.permute(2, 0, 1), image_size))
                labels.append(label)
        return ImageSet(torch.stack(images), torch.tensor(labels), classes=list(class_names))


def resize_uint8(image: torch.Tensor, size: int) -> torch.Tensor:
    """A C×H×W uint8 image resized (antialiased bilinear) to C×size×size."""
    x = F.interpolate(
        image.float().unsqueeze(0), size=(size, size), mode="bilinear", antialias=True
    )
    return x.round().clamp(0, 255).to(torch.uint8).squeeze(0)


class DatasetPrior:
    """Real images of each class from a local data set (``dataset:<data spec>``,
    its train split, matched by class name): the upper bound of a perfect
    generator, and the stand-in that lets the method run without one. Give it
    images the clients do not hold."""

    def __init__(self, spec: str):
        if not spec:
            raise ConfigError("prior dataset:<data spec> needs a data spec, e.g. dataset:digits")
        self.spec = spec

    def generate(
        self,
        class_names: Sequence[str],
        per_class: int,
        *,
        image_size: int,
        channels: int,
        seed: int,
    ) -> ImageSet:
        source = load_data(self.spec, image_size=image_size, channels=channels).train
        names = list(source.classes)
        missing = [c for c in class_names if c not in names]
        if missing:
            raise ConfigError(f"prior dataset:{self.spec} has no class {missing} (it has {names})")
        g = torch.Generator().manual_seed(seed)
        picked, labels = [], []
        for label, name in enumerate(class_names):
            pool = torch.nonzero(source.labels == names.index(name)).flatten()
            take = pool[torch.randperm(len(pool), generator=g)[:per_class]]
            picked.append(take)
            labels.append(torch.full((len(take),), label, dtype=torch.int64))
        index = torch.cat(picked)
        return ImageSet(source.images[index], torch.cat(labels), classes=list(class_names))


register_prior("diffusers", DiffusersPrior)
register_prior("dataset", DatasetPrior)
