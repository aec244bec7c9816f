"""``osfl.data.download``: tiny archives in the official formats, served by a
local HTTP server on 127.0.0.1 (nothing leaves the machine), with the checksum
table pointed at their MD5s: downloaded, verified, unpacked, read back by the
sources pixel for pixel; a wrong checksum, an archive member escaping its
folder, a link member, an unknown name and a 404 each give one clear error."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import pickle
import tarfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from osfl.data import download
from osfl.data.download import DOWNLOADS, get_dataset, mirror_url
from osfl.data.sources import load_data
from osfl.errors import ConfigError, DataError
from osfl.registry import Registry
from support.local_http import serving


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """(the folder it serves, its base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    with serving(www, monkeypatch) as url:
        yield www, url


def _served(www: Path, name: str) -> Path:
    """Where the server holds official file ``name`` (the URL's own path)."""
    f = next(f for f in DOWNLOADS.get(name.split("/")[0]).files if f.name == name.split("/")[1])
    path = www / urllib.parse.urlsplit(f.url).path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _point_checksums_at(monkeypatch: pytest.MonkeyPatch, www: Path, bad: bool = False) -> None:
    """The table, with each served file's MD5 (or a wrong one with ``bad``)."""
    table: Registry[download.Downloadable] = Registry("downloadable dataset")
    for name in DOWNLOADS.names():
        entry = DOWNLOADS.get(name)
        files = []
        for f in entry.files:
            path = www / urllib.parse.urlsplit(f.url).path.lstrip("/")
            md5 = "0" * 32 if bad else (_md5(path) if path.is_file() else f.md5)
            files.append(dataclasses.replace(f, md5=md5))
        table.add(name, dataclasses.replace(entry, files=tuple(files)))
    monkeypatch.setattr(download, "DOWNLOADS", table)


# --------------------------------------------------------------------------- official formats


def _rows(n: int, offset: int) -> np.ndarray:
    return ((np.arange(n * 3072) * 7 + offset) % 256).astype(np.uint8).reshape(n, 3072)


def _tar_gz(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def _cifar10_archive(path: Path) -> None:
    """cifar-10-python.tar.gz with 2 images per train batch and 3 test images."""
    files = {}
    for i in range(1, 6):
        batch = {b"data": _rows(2, i), b"labels": [i, (i + 5) % 10]}
        files[f"cifar-10-batches-py/data_batch_{i}"] = pickle.dumps(batch)
    test = {b"data": _rows(3, 99), b"labels": [0, 1, 9]}
    files["cifar-10-batches-py/test_batch"] = pickle.dumps(test)
    meta = {b"label_names": [f"c{k}".encode() for k in range(10)]}
    files["cifar-10-batches-py/batches.meta"] = pickle.dumps(meta)
    _tar_gz(path, files)


def _idx(path: Path, array: np.ndarray) -> None:
    head = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(gzip.compress(head + array.astype(np.uint8).tobytes(), mtime=0))


MNIST_TRAIN = (np.arange(3 * 28 * 28) % 251).astype(np.uint8).reshape(3, 28, 28)
MNIST_TEST = (np.arange(2 * 28 * 28) % 13).astype(np.uint8).reshape(2, 28, 28)


def _mnist_files(www: Path) -> None:
    _idx(_served(www, "mnist/train-images-idx3-ubyte.gz"), MNIST_TRAIN)
    _idx(_served(www, "mnist/train-labels-idx1-ubyte.gz"), np.array([7, 0, 9]))
    _idx(_served(www, "mnist/t10k-images-idx3-ubyte.gz"), MNIST_TEST)
    _idx(_served(www, "mnist/t10k-labels-idx1-ubyte.gz"), np.array([3, 3]))


# --------------------------------------------------------------------------- downloads


def test_cifar10_is_downloaded_verified_unpacked_and_read(server, tmp_path, monkeypatch) -> None:
    www, url = server
    _cifar10_archive(_served(www, "cifar10/cifar-10-python.tar.gz"))
    _point_checksums_at(monkeypatch, www)
    cache = tmp_path / "cache"
    done = get_dataset("cifar10", cache=cache, mirror=url)
    root = cache / "cifar10" / "cifar-10-batches-py"
    assert done.root == root and done.spec == f"cifar10:{root}"
    assert done.override == f"data.source=cifar10:{root}"
    assert done.downloaded == ["cifar-10-python.tar.gz"] and done.skipped == []
    assert sorted(p.name for p in (cache / "cifar10").iterdir()) == [
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
    ]
    s = load_data(done.spec)
    assert s.train.labels.tolist() == [1, 6, 2, 7, 3, 8, 4, 9, 5, 0]
    assert s.test.labels.tolist() == [0, 1, 9]
    assert torch.equal(s.train.images[2], torch.from_numpy(_rows(2, 2)[0].reshape(3, 32, 32)))
    assert torch.equal(s.test.images, torch.from_numpy(_rows(3, 99).reshape(3, 3, 32, 32)))
    assert s.train.classes[:2] == ("c0", "c1")


def test_mnist_files_are_downloaded_and_read(server, tmp_path, monkeypatch) -> None:
    www, url = server
    _mnist_files(www)
    _point_checksums_at(monkeypatch, www)
    done = get_dataset("mnist", cache=tmp_path / "c", mirror=url)
    assert done.spec == f"mnist:{tmp_path / 'c' / 'mnist'}"
    assert done.downloaded == [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ]
    s = load_data(done.spec)
    assert torch.equal(s.train.images[:, 0], torch.from_numpy(MNIST_TRAIN))
    assert torch.equal(s.test.images[:, 0], torch.from_numpy(MNIST_TEST))
    assert s.train.labels.tolist() == [7, 0, 9] and s.test.labels.tolist() == [3, 3]


def test_svhn_files_are_downloaded_and_read_with_10_as_0(server, tmp_path, monkeypatch) -> None:
    # heavy: scipy.io (only this test writes MATLAB files)
    from scipy.io import savemat

    www, url = server
    x = (np.arange(32 * 32 * 3 * 2) % 256).astype(np.uint8).reshape(32, 32, 3, 2)
    savemat(_served(www, "svhn/train_32x32.mat"), {"X": x, "y": np.array([[10.0], [4.0]])})
    savemat(_served(www, "svhn/test_32x32.mat"), {"X": x[..., :1], "y": np.array([[1.0]])})
    _point_checksums_at(monkeypatch, www)
    done = get_dataset("svhn", cache=tmp_path / "c", mirror=url)
    s = load_data(done.spec)
    assert s.train.labels.tolist() == [0, 4] and s.test.labels.tolist() == [1]
    assert torch.equal(s.train.images[1], torch.from_numpy(x[..., 1].transpose(2, 0, 1).copy()))


def test_a_second_get_skips_the_verified_files_and_redownloads_a_damaged_one(
    server, tmp_path, monkeypatch
) -> None:
    www, url = server
    _mnist_files(www)
    _point_checksums_at(monkeypatch, www)
    get_dataset("mnist", cache=tmp_path / "c", mirror=url)
    damaged = tmp_path / "c" / "mnist" / "t10k-labels-idx1-ubyte.gz"
    damaged.write_bytes(b"junk")
    again = get_dataset("mnist", cache=tmp_path / "c", mirror=url)
    assert again.downloaded == ["t10k-labels-idx1-ubyte.gz"]
    assert len(again.skipped) == 3
    assert damaged.read_bytes() == (www / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()


def test_a_checksum_mismatch_deletes_the_file_and_names_both_digests(
    server, tmp_path, monkeypatch
) -> None:
    www, url = server
    served = _served(www, "cifar10/cifar-10-python.tar.gz")
    _cifar10_archive(served)
    _point_checksums_at(monkeypatch, www, bad=True)
    with pytest.raises(DataError) as info:
        get_dataset("cifar10", cache=tmp_path / "c", mirror=url)
    assert str(info.value) == (
        f"checksum mismatch for {url}/~kriz/cifar-10-python.tar.gz: expected MD5 {'0' * 32}, "
        f"got {_md5(served)}; the file was deleted (a damaged download or a wrong mirror: "
        "run the command again)"
    )
    assert list((tmp_path / "c" / "cifar10").iterdir()) == []


def test_an_archive_member_escaping_the_folder_is_refused(server, tmp_path, monkeypatch) -> None:
    www, url = server
    _tar_gz(_served(www, "cifar10/cifar-10-python.tar.gz"), {"../evil": b"x"})
    _point_checksums_at(monkeypatch, www)
    with pytest.raises(DataError, match=r"member '\.\./evil' would land outside"):
        get_dataset("cifar10", cache=tmp_path / "c", mirror=url)
    assert not (tmp_path / "c" / "evil").exists()
    assert not (tmp_path / "c" / "cifar10" / "evil").exists()
    assert [p.name for p in (tmp_path / "c" / "cifar10").iterdir()] == ["cifar-10-python.tar.gz"]


def test_a_link_member_is_refused(server, tmp_path, monkeypatch) -> None:
    www, url = server
    archive = _served(www, "cifar100/cifar-100-python.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("cifar-100-python/train")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    _point_checksums_at(monkeypatch, www)
    with pytest.raises(DataError, match=r"member 'cifar-100-python/train' is a link or a device"):
        get_dataset("cifar100", cache=tmp_path / "c", mirror=url)
    assert not (tmp_path / "c" / "cifar100" / "cifar-100-python").exists()


def test_an_unknown_name_lists_the_valid_ones(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        get_dataset("cifar11", cache=tmp_path)
    assert str(info.value) == (
        "unknown downloadable dataset 'cifar11' (did you mean 'cifar10' or 'cifar100'?); "
        "valid: cifar10, cifar100, mnist, svhn"
    )


def test_a_404_is_one_line_and_leaves_nothing(server, tmp_path) -> None:
    _, url = server
    with pytest.raises(DataError) as info:
        get_dataset("svhn", cache=tmp_path / "c", mirror=url)
    assert str(info.value) == (
        f"cannot download {url}/housenumbers/train_32x32.mat: HTTP 404 File not found"
    )
    assert list((tmp_path / "c" / "svhn").iterdir()) == []


def test_cache_and_mirror_come_from_the_environment(server, tmp_path, monkeypatch) -> None:
    www, url = server
    _mnist_files(www)
    _point_checksums_at(monkeypatch, www)
    monkeypatch.setenv("OSFL_DATA_CACHE", str(tmp_path / "env-cache"))
    monkeypatch.setenv("OSFL_DATA_MIRROR", url + "/")
    done = get_dataset("MNIST")
    assert done.root == tmp_path / "env-cache" / "mnist" and len(done.downloaded) == 4
    monkeypatch.delenv("OSFL_DATA_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert download.cache_root() == tmp_path / "home" / ".cache" / "osfl" / "data"


def test_the_mirror_replaces_scheme_and_host_and_keeps_the_path() -> None:
    official = "http://ufldl.stanford.edu/housenumbers/train_32x32.mat"
    assert mirror_url(official, None) == official
    assert mirror_url(official, "https://m.example/") == (
        "https://m.example/housenumbers/train_32x32.mat"
    )
    assert mirror_url(official, "http://127.0.0.1:8000/data") == (
        "http://127.0.0.1:8000/data/housenumbers/train_32x32.mat"
    )
    with pytest.raises(ConfigError, match=r"--mirror must be an http\(s\) URL"):
        mirror_url(official, "file:///etc")


def test_the_table_holds_the_published_checksums() -> None:
    """The values torchvision's dataset classes list (the module docstring)."""
    md5s = {n: [f.md5 for f in DOWNLOADS.get(n).files] for n in DOWNLOADS.names()}
    assert md5s == {
        "cifar10": ["c58f30108f718f92721af3b95e74349a"],
        "cifar100": ["eb9058c3a382ffc7106e4002c42a8d85"],
        "mnist": [
            "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3",
            "ec29112dd5afa0611ce80d1b7f02629c",
        ],
        "svhn": ["e26dedcc434d2e4c54c9b2d4a06d8373", "eb5a983be6a315427106f1b164d9cef3"],
    }
