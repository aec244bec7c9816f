"""``svhn:<dir>``: the Street View House Numbers, cropped digits ("format 2";
Netzer, Wang, Coates, Bissacco, Wu & Ng, 2011, "Reading Digits in Natural
Images with Unsupervised Feature Learning", NeurIPS Workshop on Deep Learning;
http://ufldl.stanford.edu/housenumbers/): 73,257 train + 26,032 test RGB
images of 32×32, 10 classes. ``osfl data get svhn`` fetches them.

The folder holds ``train_32x32.mat`` and ``test_32x32.mat``, MATLAB v5 files
read with ``scipy.io.loadmat`` (a plain reader of arrays: it runs nothing a
file names). ``X`` is 32×32×3×N (height, width, channel, image), ``y`` is N×1
with the labels 1..10, where, as the page says, 10 stands for the digit 0:
labels here are the digits themselves (10 -> 0), as in torchvision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from osfl.data.imageset import DataSplits
from osfl.data.sources.common import check_dir, decoded_splits
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError

CLASSES = tuple(str(d) for d in range(10))
FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}


def read_mat(path: Path) -> tuple[torch.Tensor, np.ndarray]:
    """One SVHN ``.mat`` file -> uint8 N×3×H×W images and int64 labels 0..9."""
    # heavy: scipy.io (~0.2 s; only this source reads MATLAB files)
    from scipy.io import loadmat

    if not path.is_file():
        raise DataError(
            f"svhn: missing {path.name} in {str(path.parent)!r}; "
            "`osfl data get svhn` fetches the files"
        )
    try:
        mat = loadmat(str(path), variable_names=["X", "y"])
    except Exception as e:  # v7.3 (HDF5) and corrupt files raise many types (MatReadError, ...)
        raise DataError(f"cannot read {str(path)!r} as a MATLAB v5 file: {e}") from None
    x, y = mat.get("X"), mat.get("y")
    if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[2] != 3 or x.dtype != np.uint8:
        raise DataError(f"{str(path)!r}: 'X' must be a uint8 H×W×3×N array")
    if not isinstance(y, np.ndarray) or y.size != x.shape[3]:
        raise DataError(f"{str(path)!r}: 'y' must hold one label per image")
    labels = np.asarray(y, dtype=np.float64).reshape(-1)
    if labels.size and (
        (labels != np.round(labels)).any() or labels.min() < 1 or labels.max() > 10
    ):
        raise DataError(f"{str(path)!r}: labels must be whole numbers 1..10 (10 is the digit 0)")
    labels = labels.astype(np.int64) % 10
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # H×W×C×N -> N×C×H×W
    return torch.from_numpy(images), labels


@register_dataset("svhn")
def load_svhn(
    path: str,
    *,
    image_size: int | None = None,
    channels: int = 3,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> DataSplits:
    """SVHN's official train/test split as uint8 N×3×32×32 (``channels=1``
    converts to luma; ``image_size`` resizes). ``cache_dir`` is accepted for
    configs shared with other sources, and unused."""
    root = check_dir(path, "svhn")
    return decoded_splits(
        "svhn",
        lambda part: (*read_mat(root / FILES[part]), CLASSES),
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
    )
