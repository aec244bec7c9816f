"""The ImageSet contract (docs/design.md §2): decoded images held in memory.

Every data source returns a train and a test :class:`ImageSet`; partitions are
index arrays into a train ImageSet; transforms turn a uint8 batch into floats
on the training device. Keeping uint8 N×C×H×W tensors in memory is what makes
the batch pipeline fast (no per-sample PIL work while training).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from osfl.errors import DataError


@dataclass(frozen=True)
class ImageSet:
    """Images (uint8 N×C×H×W), labels (int64 N), class names, optional domains.

    ``domains`` holds an int64 domain id per sample (e.g. OfficeHome's four
    domains) and ``domain_names`` their names; both are empty for single-domain
    data.
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    domains: torch.Tensor | None = None
    domain_names: tuple[str, ...] = ()
    name: str = ""
    _fingerprint: list[str] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        imgs, labels = self.images, self.labels
        if not isinstance(imgs, torch.Tensor) or imgs.dtype != torch.uint8 or imgs.ndim != 4:
            raise DataError(
                f"ImageSet.images must be a uint8 tensor N×C×H×W, got "
                f"{getattr(imgs, 'dtype', type(imgs))} of shape {tuple(getattr(imgs, 'shape', ()))}"
            )
        if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 or labels.ndim != 1:
            raise DataError("ImageSet.labels must be an int64 tensor of shape (N,)")
        if labels.shape[0] != imgs.shape[0]:
            raise DataError(f"{imgs.shape[0]} images but {labels.shape[0]} labels")
        if labels.numel() and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise DataError(f"labels must lie in [0, {len(self.classes)}) (one per class name)")
        if self.domains is not None:
            d = self.domains
            if d.dtype != torch.int64 or d.shape != labels.shape:
                raise DataError("ImageSet.domains must be an int64 tensor shaped like labels")
        object.__setattr__(self, "classes", tuple(self.classes))
        object.__setattr__(self, "domain_names", tuple(self.domain_names))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)

    def subset(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> ImageSet:
        """The samples at ``indices`` (in that order), sharing class names."""
        # a copy: indices may be a read-only array (a partition read from its cache)
        idx = torch.from_numpy(np.array(indices, dtype=np.int64))
        return ImageSet(
            images=self.images[idx],
            labels=self.labels[idx],
            classes=self.classes,
            domains=None if self.domains is None else self.domains[idx],
            domain_names=self.domain_names,
            name=self.name,
        )

    def class_counts(self) -> np.ndarray:
        """Samples per class, length ``num_classes``."""
        return np.bincount(self.labels.numpy(), minlength=self.num_classes)

    def fingerprint(self) -> str:
        """A content hash (images, labels, classes, domains): the key of every cache.

        Computed once per object; two ImageSets with equal content share it, so
        a client trained on the same pixels is found again in the cache.
        """
        if self._fingerprint:
            return self._fingerprint[0]
        h = hashlib.sha256()
        h.update(repr((tuple(self.images.shape), self.classes, self.domain_names)).encode())
        h.update(self.images.contiguous().numpy().tobytes())
        h.update(self.labels.numpy().tobytes())
        if self.domains is not None:
            h.update(self.domains.numpy().tobytes())
        digest = h.hexdigest()[:32]
        self._fingerprint.append(digest)
        return digest


@dataclass(frozen=True)
class DataSplits:
    """What a source returns: the train and the test ImageSet, and (with
    ``data.validation_fraction``) a validation set carved from the train set,
    on which settings are chosen so that the test set never is."""

    train: ImageSet
    test: ImageSet
    validation: ImageSet | None = None

    @property
    def num_classes(self) -> int:
        return self.train.num_classes
