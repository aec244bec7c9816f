"""In-memory batch iterator: the training loop's replacement for a
``torch.utils.data.DataLoader`` over decoded images.

The whole (client's) set is moved to the training device once as uint8
(50,000 CIFAR images are 150 MB), and each batch is one ``index_select`` by a
fresh seeded permutation: no worker processes, no per-sample Python, no
host-to-device copy per step (docs/design.md §7). Augmentation then runs on the
batch with :mod:`osfl.data.transforms`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from osfl.data.device_path import device_path
from osfl.data.imageset import ImageSet
from osfl.errors import DataError


class BatchIterator:
    """Iterate ``(uint8 images, labels)`` batches on ``device``; ``len()`` = batches per epoch.

    Every ``iter()`` is one epoch; with ``shuffle`` each epoch draws a new
    permutation from ``generator`` (so a seeded generator gives the same
    sequence of epochs every run). ``drop_last`` drops the final short batch.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
    ):
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size <= 0
        ):
            raise DataError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise DataError("BatchIterator needs images and labels as tensors")
        if images.ndim < 1 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DataError(
                f"images ({tuple(images.shape)}) and labels ({tuple(labels.shape)}) must have "
                f"the same number of samples"
            )
        if generator is not None and not isinstance(generator, torch.Generator):
            raise DataError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.device = torch.device(device)
        self.images = images.to(self.device)
        self.labels = labels.to(self.device)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.generator = generator

    @classmethod
    def from_imageset(
        cls,
        data: ImageSet,
        batch_size: int,
        *,
        indices: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
    ) -> BatchIterator:
        """Batches of ``data`` (or of its samples at ``indices``, e.g. one client's)."""
        if indices is not None:
            data = data.subset(indices)
        return cls(
            data.images,
            data.labels,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            generator=generator,
            device=device,
        )

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def __len__(self) -> int:
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def _order(self) -> torch.Tensor:
        n = self.num_samples
        if not self.shuffle:
            return torch.arange(n, device=self.device)
        gdev = self.generator.device if self.generator is not None else self.device
        return torch.randperm(n, generator=self.generator, device=gdev).to(self.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.images.index_select(0, idx), self.labels.index_select(0, idx)

    def __repr__(self) -> str:
        return (
            f"BatchIterator(n={self.num_samples}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, device={self.device})"
        )


class DeviceLoader(BatchIterator):
    """The loader of the device path: the permutations drawn as the plain
    loader draws them (from the run's CPU generator), sent to the device
    without blocking (from pinned memory on CUDA), so an epoch's first step
    does not wait for the GPU."""

    def _order(self) -> torch.Tensor:
        g = self.generator
        if not self.shuffle or g is None or g.device.type != "cpu" or self.device.type == "cpu":
            return super()._order()
        perm = torch.randperm(self.num_samples, generator=g)
        if self.device.type == "cuda":
            perm = perm.pin_memory()
        return perm.to(self.device, non_blocking=True)


def client_loader(
    data: ImageSet,
    batch_size: int,
    drop_last: bool,
    generator: torch.Generator,
    device: torch.device,
) -> BatchIterator:
    """A client's shuffled training batches on ``device`` (:class:`DeviceLoader`
    on the device path), as both training loops draw them; an empty set, or
    one smaller than a batch with ``drop_last``, is a :class:`DataError`."""
    if len(data) == 0:
        raise DataError("cannot train on an empty client data set")
    cls = DeviceLoader if device_path(device) else BatchIterator
    loader = cls(
        data.images,
        data.labels,
        batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=generator,
        device=device,
    )
    if len(loader) == 0:
        raise DataError(
            f"client has {len(data)} samples, fewer than batch_size={batch_size} with "
            "drop_last=True: lower batch_size or set drop_last=false"
        )
    return loader
