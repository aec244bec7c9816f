"""``digits``: scikit-learn's bundled handwritten digits (UCI "Optical
Recognition of Handwritten Digits", Alpaydin & Kaynak 1998; 1,797 8×8 images,
grey levels 0..16, 10 classes).

It ships inside scikit-learn, so it is the offline data of the tests and of the
default run: real images, no download, loaded in milliseconds.
"""

from __future__ import annotations

import numpy as np
import torch

from osfl.data.imageset import DataSplits
from osfl.data.sources.common import (
    check_channels,
    check_fraction,
    check_positive_int,
    check_seed,
    finish,
    make_imageset,
    stratified_split,
    subset_splits,
)
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError


@register_dataset("digits")
def load_digits_data(
    path: str = "",
    *,
    image_size: int | None = None,
    channels: int = 1,
    test_fraction: float = 0.25,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> DataSplits:
    """Digits as uint8 images (0..16 scaled to 0..255), seeded stratified split.

    ``image_size`` upsamples the native 8×8 (e.g. 16 or 32 for CNNs that need
    more pixels); ``channels=3`` replicates the grey level for RGB models.
    ``cache_dir`` is accepted so that configs move between sources, and unused
    (loading takes milliseconds).
    """
    # heavy: scikit-learn (~1 s; only the digits source needs it)
    from sklearn.datasets import load_digits

    if path:
        raise DataError(f"'digits' takes no path (it is bundled with scikit-learn), got {path!r}")
    image_size = check_positive_int("image_size", image_size)
    channels = check_channels(channels)
    test_fraction = check_fraction("test_fraction", test_fraction)
    max_per_class = check_positive_int("max_per_class", max_per_class)
    test_max_per_class = check_positive_int("test_max_per_class", test_max_per_class)
    seed = check_seed(seed)

    bunch = load_digits()
    pixels = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    images = torch.from_numpy(pixels).unsqueeze(1)  # N×1×8×8
    images = finish(images, image_size=image_size, channels=channels)
    labels = bunch.target.astype(np.int64)
    classes = tuple(str(c) for c in range(10))

    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    splits = DataSplits(
        train=make_imageset(images[train_idx], labels[train_idx], classes, name="digits"),
        test=make_imageset(images[test_idx], labels[test_idx], classes, name="digits"),
    )
    return subset_splits(splits, max_per_class, test_max_per_class, seed)
