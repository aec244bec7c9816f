"""``cifar10:<dir>`` / ``cifar100:<dir>``: the official "python version" of
CIFAR (Krizhevsky, 2009, "Learning Multiple Layers of Features from Tiny
Images"; https://www.cs.toronto.edu/~kriz/cifar.html).

CIFAR-10: ``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``;
CIFAR-100: ``train``, ``test``, ``meta`` (fine and coarse labels). Each is a
pickled dict holding a uint8 N×3072 array (rows of R, G, B planes, 32×32) and
label lists.

These are user files, and unpickling runs whatever a file names. The
unpickler here admits only the globals numpy needs to rebuild an array
(``_reconstruct``, ``ndarray``, ``dtype``); any other global -- ``os.system``,
``builtins.eval``, ... -- is refused with a :class:`~osfl.errors.DataError`
before it is looked up, so nothing a file names is ever called.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osfl.data.imageset import DataSplits
from osfl.data.sources.common import DecodedPart, check_dir, decoded_splits
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError

try:  # numpy >= 2 moved numpy.core to numpy._core (pickles may name either)
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct

#: (module, name) -> object: the only globals a CIFAR batch needs.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """A pickle reader that can build dicts, lists, bytes and numpy arrays only."""

    def __init__(self, file: Any, path: Path):
        # encoding="bytes": the official files were written by Python 2, whose
        # str payloads (array buffers) must stay bytes.
        super().__init__(file, encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        obj = _ALLOWED.get((module, name))
        if obj is None:
            raise DataError(
                f"refusing to unpickle {module}.{name} from {str(self._path)!r}: an official "
                f"CIFAR batch holds only numpy arrays and lists; this file is not one"
            )
        return obj


def read_batch(path: Path) -> dict[str, Any]:
    """Unpickle one CIFAR file with the restricted unpickler; keys become str."""
    if not path.is_file():
        raise DataError(f"missing CIFAR file {str(path)!r}; point the spec at the extracted folder")
    try:
        with open(path, "rb") as f:
            obj = _ArrayOnlyUnpickler(f, path).load()
    except DataError:
        raise
    except Exception as e:  # truncated / corrupt pickles raise many types
        raise DataError(f"cannot read CIFAR file {str(path)!r}: {type(e).__name__}: {e}") from e
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR file {str(path)!r} does not hold a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _names(meta: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    names = meta.get(key)
    if not isinstance(names, list) or not names:
        raise DataError(f"{str(path)!r} has no list {key!r} of class names")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)


def _images_labels(
    batches: list[dict[str, Any]], label_key: str, num_classes: int, path: Path
) -> tuple[torch.Tensor, np.ndarray]:
    datas, labels = [], []
    for b in batches:
        data, lab = b.get("data"), b.get(label_key)
        if (
            not isinstance(data, np.ndarray)
            or data.dtype != np.uint8
            or data.ndim != 2
            or data.shape[1] != 3072
        ):
            raise DataError(f"CIFAR batch in {str(path)!r}: 'data' must be a uint8 N×3072 array")
        lab = np.asarray(lab, dtype=np.int64) if lab is not None else None
        if lab is None or lab.shape != (data.shape[0],):
            raise DataError(
                f"CIFAR batch in {str(path)!r}: {label_key!r} must hold one label per row"
            )
        if lab.size and (lab.min() < 0 or lab.max() >= num_classes):
            raise DataError(f"CIFAR batch in {str(path)!r}: labels outside [0, {num_classes})")
        datas.append(data)
        labels.append(lab)
    data = np.concatenate(datas).reshape(-1, 3, 32, 32)
    return torch.from_numpy(np.ascontiguousarray(data)), np.concatenate(labels)


def _load(
    root: Path,
    train_files: list[str],
    test_files: list[str],
    meta_file: str,
    names_key: str,
    label_key: str,
    name: str,
    *,
    image_size: int | None,
    channels: int,
    max_per_class: int | None,
    test_max_per_class: int | None,
    seed: int,
) -> DataSplits:
    files = {"train": train_files, "test": test_files}

    def read(part: str) -> DecodedPart:  # after decoded_splits checked the options
        classes = _names(read_batch(root / meta_file), names_key, root / meta_file)
        batches = [read_batch(root / f) for f in files[part]]
        return (*_images_labels(batches, label_key, len(classes), root), classes)

    return decoded_splits(
        name,
        read,
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
    )


@register_dataset("cifar10")
def load_cifar10(
    path: str,
    *,
    image_size: int | None = None,
    channels: int = 3,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> DataSplits:
    """CIFAR-10 from ``cifar-10-batches-py`` (10 classes, 50,000 + 10,000 images).

    ``cache_dir`` is accepted for configs shared with other sources, and unused:
    the batches already hold decoded pixels."""
    root = check_dir(path, "cifar10")
    train = [f"data_batch_{i}" for i in range(1, 6)]
    return _load(
        root,
        train,
        ["test_batch"],
        "batches.meta",
        "label_names",
        "labels",
        "cifar10",
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
    )


@register_dataset("cifar100")
def load_cifar100(
    path: str,
    *,
    image_size: int | None = None,
    channels: int = 3,
    label_mode: str = "fine",
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> DataSplits:
    """CIFAR-100 from ``cifar-100-python``; ``label_mode`` "fine" (100) or "coarse" (20).

    ``cache_dir`` is accepted and unused, as for CIFAR-10."""
    root = check_dir(path, "cifar100")
    if label_mode not in ("fine", "coarse"):
        raise DataError(f"label_mode must be 'fine' or 'coarse', got {label_mode!r}")
    return _load(
        root,
        ["train"],
        ["test"],
        "meta",
        f"{label_mode}_label_names",
        f"{label_mode}_labels",
        "cifar100",
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
    )
