"""``mnist:<dir>``: the official idx files, gzipped or plain, read exactly;
the source options; and a short, forged or missing file is one clear error."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from osfl.data.sources import dataset_options, load_data
from osfl.errors import DataError

TRAIN = (np.arange(4 * 28 * 28) * 3 % 256).astype(np.uint8).reshape(4, 28, 28)
TEST = (np.arange(2 * 28 * 28) % 7).astype(np.uint8).reshape(2, 28, 28)


def _idx(array: np.ndarray) -> bytes:
    head = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return head + array.astype(np.uint8).tobytes()


def _write(root: Path, gz: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "train-images-idx3-ubyte": TRAIN,
        "train-labels-idx1-ubyte": np.array([5, 0, 5, 9]),
        "t10k-images-idx3-ubyte": TEST,
        "t10k-labels-idx1-ubyte": np.array([1, 2]),
    }
    for name, array in files.items():
        if gz:
            (root / f"{name}.gz").write_bytes(gzip.compress(_idx(array), mtime=0))
        else:
            (root / name).write_bytes(_idx(array))
    return root


@pytest.mark.parametrize("gz", [True, False])
def test_the_idx_files_are_read_exactly(tmp_path: Path, gz: bool) -> None:
    s = load_data(f"mnist:{_write(tmp_path / 'm', gz)}")
    assert s.train.images.shape == (4, 1, 28, 28) and s.train.images.dtype == torch.uint8
    assert torch.equal(s.train.images[:, 0], torch.from_numpy(TRAIN))
    assert torch.equal(s.test.images[:, 0], torch.from_numpy(TEST))
    assert s.train.labels.tolist() == [5, 0, 5, 9] and s.test.labels.tolist() == [1, 2]
    assert s.train.classes == tuple("0123456789") and s.train.name == "mnist"


def test_the_common_options(tmp_path: Path) -> None:
    root = _write(tmp_path / "m")
    assert dataset_options("mnist") == [
        "image_size",
        "channels",
        "max_per_class",
        "test_max_per_class",
        "seed",
        "cache_dir",
    ]
    s = load_data(f"mnist:{root}", channels=3, image_size=14, max_per_class=1)
    assert s.train.images.shape == (3, 3, 14, 14)
    assert sorted(s.train.labels.tolist()) == [0, 5, 9]
    assert torch.equal(s.train.images[:, 0], s.train.images[:, 2])
    with pytest.raises(DataError, match="channels must be 1"):
        load_data(f"mnist:{root}", channels=2)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    root = _write(tmp_path / "m", gz=False)
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError) as info:
        load_data(f"mnist:{root}")
    assert str(info.value) == f"{str(path)!r} is truncated: 1563 of 1568 bytes"


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    root = _write(tmp_path / "m", gz=False)
    (root / "train-labels-idx1-ubyte").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(DataError, match="is not an idx file"):
        load_data(f"mnist:{root}")
    (root / "train-labels-idx1-ubyte").write_bytes(_idx(np.zeros((4, 2))))
    with pytest.raises(DataError, match=r"expected 1-d unsigned bytes \(type 0x08\), got 2-d"):
        load_data(f"mnist:{root}")
    (root / "train-labels-idx1-ubyte").write_bytes(_idx(np.array([1, 2, 3])))
    with pytest.raises(DataError, match="train has 4 images but 3 labels"):
        load_data(f"mnist:{root}")
    (root / "train-labels-idx1-ubyte").write_bytes(_idx(np.array([1, 2, 3, 10])))
    with pytest.raises(DataError, match=r"labels outside \[0, 10\)"):
        load_data(f"mnist:{root}")


def test_a_header_announcing_huge_dimensions_is_refused_before_reading(tmp_path: Path) -> None:
    root = _write(tmp_path / "m", gz=False)
    big = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (1 << 20, 1 << 10, 1 << 10))
    (root / "train-images-idx3-ubyte").write_bytes(big)
    with pytest.raises(DataError, match="too large for MNIST"):
        load_data(f"mnist:{root}")


def test_a_missing_file_says_how_to_get_it(tmp_path: Path) -> None:
    root = _write(tmp_path / "m")
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as info:
        load_data(f"mnist:{root}")
    assert str(info.value) == (
        f"mnist: missing t10k-labels-idx1-ubyte(.gz) in {str(root)!r}; "
        "`osfl data get mnist` fetches the files"
    )
