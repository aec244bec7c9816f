"""The growing pool of synthetic samples that the server model is distilled on.

DENSE and Co-Boosting keep every synthesised batch (``ImagePool`` with
``his=True`` in their code) and distil each epoch over the whole history;
FedMITR's Algorithm 1 does the same (``D_S <- D_S ∪ {x̂}``, then one pass over
``D_S``). Unlike those codes, the pool stays in memory as float tensors in the
*model-input space* (normalised), so there is no PNG round-trip (which would
quantise the images) and no per-sample PIL work (docs/design.md §7).

Every sample has an image, an optional hard label (``-1`` = none) and any
number of named per-sample extras (teacher logits, FedMITR's kept-patch
masks, ...). ``max_size`` caps the pool: the oldest samples go first (FIFO),
which bounds memory on long runs; ``None`` keeps everything, as the papers do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from osfl.errors import ConfigError, DataError

__all__ = ["PoolBatch", "SyntheticPool"]


@dataclass
class PoolBatch:
    """A batch drawn from the pool: images (B, C, H, W), labels (B,), extras."""

    images: torch.Tensor
    labels: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def has_labels(self) -> bool:
        return bool((self.labels >= 0).all())


class SyntheticPool:
    """In-memory synthetic data set with a size cap.

    >>> pool = SyntheticPool(max_size=1000)
    >>> pool.add(x, labels=y, logits=t)           # x: (B, C, H, W) float
    >>> for batch in pool.batches(64, generator=g):  # one shuffled pass
    ...     ...
    """

    def __init__(self, max_size: int | None = None, device: torch.device | str = "cpu"):
        if max_size is not None and max_size < 1:
            raise ConfigError(f"pool max_size must be >= 1 or null, got {max_size}")
        self.max_size = max_size
        self.device = torch.device(device)
        self._images: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self._extras: dict[str, torch.Tensor] = {}
        self.total_added = 0

    def __len__(self) -> int:
        return 0 if self._images is None else int(self._images.shape[0])

    @property
    def images(self) -> torch.Tensor:
        if self._images is None:
            raise DataError("the synthetic pool is empty")
        return self._images

    @property
    def labels(self) -> torch.Tensor:
        if self._labels is None:
            raise DataError("the synthetic pool is empty")
        return self._labels

    @property
    def extras(self) -> dict[str, torch.Tensor]:
        return dict(self._extras)

    def add(
        self, images: torch.Tensor, labels: torch.Tensor | None = None, **extras: torch.Tensor
    ) -> None:
        """Append a batch (detached, moved to the pool's device).

        Every batch must carry the same extras with the same trailing shapes as
        the first one; images must keep one shape.
        """
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            raise DataError(
                f"pool images must be a (B, C, H, W) tensor, got {tuple(getattr(images, 'shape', ()))}"
            )
        b = images.shape[0]
        if labels is None:
            labels = torch.full((b,), -1, dtype=torch.long)
        if labels.shape != (b,):
            raise DataError(f"pool labels must have shape ({b},), got {tuple(labels.shape)}")
        for k, v in extras.items():
            if v.shape[0] != b:
                raise DataError(f"pool extra {k!r} has {v.shape[0]} rows for {b} images")
        if self._images is not None:
            if images.shape[1:] != self._images.shape[1:]:
                raise DataError(
                    f"pool holds {tuple(self._images.shape[1:])} images, got {tuple(images.shape[1:])}"
                )
            if set(extras) != set(self._extras):
                raise DataError(
                    f"pool extras {sorted(self._extras)} differ from this batch's {sorted(extras)}"
                )
        imgs = images.detach().to(self.device, torch.float32)
        labs = labels.detach().to(self.device, torch.long)
        ext = {k: v.detach().to(self.device) for k, v in extras.items()}
        if self._images is None:
            self._images, self._labels, self._extras = imgs, labs, ext
        else:
            self._images = torch.cat([self._images, imgs])
            self._labels = torch.cat([self.labels, labs])
            self._extras = {k: torch.cat([self._extras[k], ext[k]]) for k in ext}
        self.total_added += b
        self._trim()

    def _trim(self) -> None:
        if self.max_size is None or len(self) <= self.max_size:
            return
        drop = len(self) - self.max_size
        self._images = self.images[drop:]
        self._labels = self.labels[drop:]
        self._extras = {k: v[drop:] for k, v in self._extras.items()}

    def _take(self, idx: torch.Tensor) -> PoolBatch:
        idx = idx.to(self.device)
        return PoolBatch(
            self.images[idx], self.labels[idx], {k: v[idx] for k, v in self._extras.items()}
        )

    def batches(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> Iterator[PoolBatch]:
        """One pass over the pool in batches (shuffled with ``generator``)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        for i in range(0, stop, batch_size):
            yield self._take(order[i : i + batch_size])

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> PoolBatch:
        """``batch_size`` samples drawn uniformly without replacement (all if fewer)."""
        n = len(self)
        if n == 0:
            raise DataError("cannot sample from an empty synthetic pool")
        idx = torch.randperm(n, generator=generator)[: min(batch_size, n)]
        return self._take(idx)

    def clear(self) -> None:
        self._images = self._labels = None
        self._extras = {}
