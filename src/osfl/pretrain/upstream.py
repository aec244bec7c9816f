"""The declared upstream data of a pretrained encoder: a source, some of its classes.

``--upstream imagefolder:/data/cifar10 --classes 0,1,2,3,4`` keeps the train
and test images of those classes (by index into the source's class list, or by
name), relabelled 0..k-1 in the order given, so that a federated task can use
the other classes of the same source without the encoder having seen them.
The source's test split, restricted to the same classes, is the held-out set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from osfl.data.classes import resolve_classes, select_classes
from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.sources import load_data
from osfl.errors import ConfigError


@dataclass(frozen=True)
class Upstream:
    """The upstream train set, its held-out set and where they came from."""

    source: str
    classes: tuple[str, ...]
    class_indices: tuple[int, ...]
    train: ImageSet
    held_out: ImageSet
    options: dict[str, Any]


def parse_classes(text: str | Sequence[str] | None) -> list[str]:
    """``"0,1,2"`` / ``"cat,dog"`` / a list -> list of entries (empty = all classes)."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else [str(t) for t in text]
    out = [t.strip() for t in items if t.strip()]
    if len(set(out)) != len(out):
        raise ConfigError(f"classes {out} name a class twice")
    return out


def cap_per_class(data: ImageSet, cap: int | None, seed: int) -> ImageSet:
    """A seeded class-balanced subset: at most ``cap`` images of each class
    (all of them for ``cap=None``), in their original order."""
    if cap is None:
        return data
    rng = np.random.default_rng(seed)
    labels = data.labels.numpy()
    keep = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:cap] for c in range(data.num_classes)]
    )
    return data.subset(np.sort(keep))


def from_splits(
    source: str, splits: DataSplits, classes: Sequence[str], options: dict[str, Any]
) -> Upstream:
    """Restrict loaded ``splits`` to ``classes``; refuses an empty train or held-out set."""
    idx = resolve_classes(classes, splits.train.classes, source)
    train = select_classes(splits.train, idx)
    held_out = select_classes(splits.test, idx)
    if len(train) == 0 or len(held_out) == 0:
        raise ConfigError(
            f"upstream {source!r} classes {list(classes)}: {len(train)} train and "
            f"{len(held_out)} held-out images; both must be non-empty"
        )
    return Upstream(source, train.classes, tuple(idx), train, held_out, options)


def load_upstream(
    source: str,
    classes: Sequence[str] = (),
    *,
    image_size: int | None = None,
    channels: int | None = None,
    max_per_class: int | None = None,
    cache_dir: str | None = None,
    options: dict[str, Any] | None = None,
) -> Upstream:
    """Load ``source`` with the options that are set and keep ``classes``."""
    named = {
        "image_size": image_size,
        "channels": channels,
        "max_per_class": max_per_class,
        "cache_dir": cache_dir,
    }
    opts = {k: v for k, v in named.items() if v is not None} | dict(options or {})
    splits = load_data(source, **opts)
    recorded = {k: v for k, v in opts.items() if k != "cache_dir"}
    return from_splits(source, splits, classes, recorded)
