"""``svhn:<dir>``: the cropped-digit ``.mat`` files (written here with
``scipy.io.savemat``) read exactly, label 10 as the digit 0; the source
options; and malformed or missing files are one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

from osfl.data.sources import dataset_options, load_data
from osfl.errors import DataError

X = (np.arange(32 * 32 * 3 * 3) * 5 % 256).astype(np.uint8).reshape(32, 32, 3, 3)


def _write(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    savemat(root / "train_32x32.mat", {"X": X, "y": np.array([[10.0], [1.0], [9.0]])})
    savemat(root / "test_32x32.mat", {"X": X[..., 1:], "y": np.array([[10], [3]], np.uint8)})
    return root


def test_the_mat_files_are_read_exactly_with_10_as_0(tmp_path: Path) -> None:
    s = load_data(f"svhn:{_write(tmp_path / 's')}")
    assert s.train.images.shape == (3, 3, 32, 32) and s.train.images.dtype == torch.uint8
    for i in range(3):  # H×W×C×N -> N×C×H×W
        assert torch.equal(s.train.images[i], torch.from_numpy(X[..., i].transpose(2, 0, 1)))
    assert torch.equal(s.test.images, s.train.images[1:])
    assert s.train.labels.tolist() == [0, 1, 9] and s.test.labels.tolist() == [0, 3]
    assert s.train.classes == tuple("0123456789") and s.test.name == "svhn"
    assert int(s.train.images[0, 1, 0, 2]) == int(X[0, 2, 1, 0]) == 105


def test_the_common_options(tmp_path: Path) -> None:
    root = _write(tmp_path / "s")
    assert dataset_options("svhn") == dataset_options("mnist")
    s = load_data(f"svhn:{root}", channels=1, image_size=8, test_max_per_class=1)
    assert s.train.images.shape == (3, 1, 8, 8) and s.test.images.shape == (2, 1, 8, 8)


def test_malformed_files_are_refused(tmp_path: Path) -> None:
    root = _write(tmp_path / "s")
    path = root / "train_32x32.mat"
    savemat(path, {"X": X, "y": np.array([[0.0], [1.0], [2.0]])})
    with pytest.raises(DataError, match=r"labels must be whole numbers 1\.\.10"):
        load_data(f"svhn:{root}")
    savemat(path, {"X": X, "y": np.array([[1.0], [2.0]])})
    with pytest.raises(DataError, match="'y' must hold one label per image"):
        load_data(f"svhn:{root}")
    savemat(path, {"X": X.astype(np.float32), "y": np.array([[1.0], [2.0], [3.0]])})
    with pytest.raises(DataError, match=r"'X' must be a uint8 H×W×3×N array"):
        load_data(f"svhn:{root}")
    path.write_bytes(b"MATLAB 7.3 MAT-file, but really nothing")
    with pytest.raises(DataError, match=r"cannot read .* as a MATLAB v5 file"):
        load_data(f"svhn:{root}")


def test_a_missing_file_says_how_to_get_it(tmp_path: Path) -> None:
    root = _write(tmp_path / "s")
    (root / "test_32x32.mat").unlink()
    with pytest.raises(DataError) as info:
        load_data(f"svhn:{root}")
    assert str(info.value) == (
        f"svhn: missing test_32x32.mat in {str(root)!r}; `osfl data get svhn` fetches the files"
    )
