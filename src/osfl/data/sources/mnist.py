"""``mnist:<dir>``: MNIST in its official idx files (LeCun, Bottou, Bengio &
Haffner, 1998, "Gradient-Based Learning Applied to Document Recognition";
http://yann.lecun.com/exdb/mnist/): 60,000 + 10,000 handwritten digits, 28×28
grey levels, 10 classes. ``osfl data get mnist`` fetches them.

The folder holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each gzipped
(``.gz``, as published) or plain. The idx format, as the page describes it: two
zero bytes, a type code (``0x08``: unsigned byte), the number of dimensions,
each dimension as a big-endian uint32, then the values in row-major order.
Exactly the bytes the header announces are read, so a forged header cannot make
a small gzip expand without bound; a short file is an error.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

from osfl.data.imageset import DataSplits
from osfl.data.sources.common import check_dir, decoded_splits
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError

#: The idx type code of unsigned bytes, the only one MNIST uses.
_UBYTE = 0x08
#: The largest value count a header may announce (MNIST's train images: 47 M).
_MAX_VALUES = 1 << 30
CLASSES = tuple(str(d) for d in range(10))


def _find(root: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (root / name).is_file():
            return root / name
    raise DataError(
        f"mnist: missing {stem}(.gz) in {str(root)!r}; `osfl data get mnist` fetches the files"
    )


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """One idx file of unsigned bytes with ``ndim`` dimensions (gz or plain)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[:2] != b"\0\0":
                raise DataError(f"{str(path)!r} is not an idx file (bad magic number)")
            if head[2] != _UBYTE or head[3] != ndim:
                raise DataError(
                    f"{str(path)!r}: expected {ndim}-d unsigned bytes (type 0x08), got "
                    f"{head[3]}-d of type 0x{head[2]:02x}"
                )
            raw = f.read(4 * ndim)
            if len(raw) < 4 * ndim:
                raise DataError(f"{str(path)!r} is truncated in its header")
            dims = struct.unpack(f">{ndim}I", raw)
            count = int(np.prod(dims, dtype=np.int64))
            if count > _MAX_VALUES:
                raise DataError(f"{str(path)!r} announces {dims}, too large for MNIST")
            data = f.read(count)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {str(path)!r}: {e}") from None
    if len(data) < count:
        raise DataError(f"{str(path)!r} is truncated: {len(data)} of {count} bytes")
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def _part(root: Path, prefix: str) -> tuple[torch.Tensor, np.ndarray]:
    images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte"), 3)
    labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte"), 1).astype(np.int64)
    if labels.shape[0] != images.shape[0]:
        raise DataError(
            f"mnist: {prefix} has {images.shape[0]} images but {labels.shape[0]} labels"
        )
    if labels.size and labels.max() >= len(CLASSES):
        raise DataError(f"mnist: {prefix} labels outside [0, {len(CLASSES)})")
    return torch.from_numpy(images.copy()).unsqueeze(1), labels


@register_dataset("mnist")
def load_mnist(
    path: str,
    *,
    image_size: int | None = None,
    channels: int = 1,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> DataSplits:
    """MNIST's official train/test split as uint8 N×1×28×28 (``channels=3``
    replicates the grey level; ``image_size`` resizes). ``cache_dir`` is
    accepted for configs shared with other sources, and unused: the files
    already hold decoded pixels."""
    root = check_dir(path, "mnist")
    prefix = {"train": "train", "test": "t10k"}
    return decoded_splits(
        "mnist",
        lambda part: (*_part(root, prefix[part]), CLASSES),
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
    )
