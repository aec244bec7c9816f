"""Which classes of a source a task uses, and in which label order.

Two parties that name the same class must give it the same label. A task may
keep some classes of a source (``data.classes: [cat, dog]``; a pretrained
encoder made on the other classes of the same source then never saw the
task's), and a real site's folders must land on the labels the federation
agreed on whatever subset of them the site holds.

- :func:`resolve_classes` + :func:`select_classes`: keep the named classes
  (names, or indices into the source's list), relabelled 0..k-1 in the order
  given; the other classes' images are dropped.
- :func:`align_classes`: relabel a site's data onto an agreed list by name; a
  class outside the list is refused, named (a site is never trained on images
  the others cannot label).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from osfl.data.imageset import DataSplits, ImageSet
from osfl.errors import ConfigError, DataError

__all__ = ["align_classes", "keep_classes", "resolve_classes", "select_classes"]


def resolve_classes(
    wanted: Sequence[str | int], available: Sequence[str], source: str
) -> list[int]:
    """Indices into ``available`` of the wanted classes (names first, then indices)."""
    if not wanted:
        return list(range(len(available)))
    out: list[int] = []
    for w in wanted:
        key = str(w).strip()
        if key in available:
            out.append(list(available).index(key))
        elif key.lstrip("-").isdigit() and 0 <= int(key) < len(available):
            out.append(int(key))
        else:
            raise ConfigError(
                f"class {key!r} is not in {source!r}; its classes are "
                f"{', '.join(f'{i}={c}' for i, c in enumerate(available))}"
            )
    if len(set(out)) != len(out):
        raise ConfigError(f"classes {list(wanted)} name a class of {source!r} twice")
    if len(out) < 2:
        raise ConfigError(f"a task needs at least 2 classes of {source!r}, got {list(wanted)}")
    return out


def select_classes(data: ImageSet, indices: Sequence[int]) -> ImageSet:
    """The samples of classes ``indices``, relabelled 0..k-1 in that order."""
    mapping = np.full(data.num_classes, -1, dtype=np.int64)
    mapping[np.asarray(indices, dtype=np.int64)] = np.arange(len(indices))
    new = torch.from_numpy(mapping)[data.labels]
    keep = torch.nonzero(new >= 0).squeeze(1)
    return ImageSet(
        images=data.images[keep].contiguous(),
        labels=new[keep].contiguous(),
        classes=tuple(data.classes[i] for i in indices),
        domains=None if data.domains is None else data.domains[keep],
        domain_names=data.domain_names,
        name=data.name,
    )


def keep_classes(splits: DataSplits, wanted: Sequence[str | int], source: str) -> DataSplits:
    """Both splits restricted to ``wanted`` (see :func:`resolve_classes`)."""
    idx = resolve_classes(wanted, splits.train.classes, source)
    return DataSplits(select_classes(splits.train, idx), select_classes(splits.test, idx))


def _aligned(images: ImageSet, classes: Sequence[str], where: str) -> ImageSet:
    index = {name: i for i, name in enumerate(classes)}
    unknown = [c for c in images.classes if c not in index]
    if unknown:
        raise DataError(
            f"{where}: class(es) {', '.join(map(repr, unknown))} are not among the job's "
            f"classes ({', '.join(classes)}); rename or remove those folders, or add them to "
            "data.classes on every party"
        )
    mapping = torch.tensor([index[c] for c in images.classes], dtype=torch.int64)
    labels = mapping[images.labels] if len(images) else images.labels
    return ImageSet(
        images.images,
        labels,
        tuple(classes),
        domains=images.domains,
        domain_names=images.domain_names,
        name=images.name,
    )


def align_classes(splits: DataSplits, classes: Sequence[str], where: str) -> DataSplits:
    """``splits`` relabelled onto the agreed ``classes`` by name (a site may
    lack some of them; it may not hold others)."""
    return DataSplits(_aligned(splits.train, classes, where), _aligned(splits.test, classes, where))
