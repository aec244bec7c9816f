"""Data sources: digits, image folders (three layouts + cache), CIFAR pickles
(including a malicious one), Hugging Face datasets (offline, from tmp dirs)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from osfl.data import load_data
from osfl.data.sources import DATASETS, list_datasets
from osfl.data.sources import common as common_mod
from osfl.errors import ConfigError, DataError

# --------------------------------------------------------------------------- registry / spec


def test_registry_lists_sources():
    assert {"digits", "imagefolder", "cifar10", "cifar100", "hf"} <= set(list_datasets())
    assert list_datasets() == DATASETS.names()


def test_unknown_source_and_option_and_bad_spec():
    with pytest.raises(ConfigError, match=r"valid: .*digits"):
        load_data("mnistt")
    with pytest.raises(DataError, match=r"unknown option.*colour.*valid options: image_size"):
        load_data("digits", colour=3)
    with pytest.raises(DataError, match="data spec"):
        load_data("")


# --------------------------------------------------------------------------- digits


def test_digits_default_split_is_stratified_and_scaled():
    s = load_data("digits")
    assert len(s.train) + len(s.test) == 1797
    assert s.train.images.shape[1:] == (1, 8, 8) and s.train.images.dtype == torch.uint8
    assert s.train.classes == tuple(str(i) for i in range(10))
    # sklearn grey levels 0..16 -> 0..255: both ends are reached and only 17 values occur
    vals = torch.unique(torch.cat([s.train.images.flatten(), s.test.images.flatten()]))
    assert vals.min() == 0 and vals.max() == 255 and len(vals) <= 17
    # each class puts n * 0.25, rounded half up, in test
    total = s.train.class_counts() + s.test.class_counts()
    np.testing.assert_array_equal(s.test.class_counts(), np.floor(total * 0.25 + 0.5).astype(int))


def test_digits_seed_determinism_and_options():
    a, b = load_data("digits", seed=3), load_data("digits", seed=3)
    c = load_data("digits", seed=4)
    assert a.train.fingerprint() == b.train.fingerprint()
    assert a.train.fingerprint() != c.train.fingerprint()
    s = load_data(
        "digits", image_size=16, channels=3, max_per_class=7, test_max_per_class=2, seed=3
    )
    assert s.train.images.shape == (70, 3, 16, 16) and s.test.images.shape == (20, 3, 16, 16)
    assert (s.train.class_counts() == 7).all()
    assert torch.equal(s.train.images[:, 0], s.train.images[:, 2])  # grey replicated


@pytest.mark.parametrize(
    ("opts", "msg"),
    [
        ({"image_size": 0}, "image_size must be a positive integer"),
        ({"channels": 2}, "channels must be 1"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"max_per_class": -1}, "max_per_class"),
        ({"seed": -1}, "seed"),
    ],
)
def test_digits_bad_values(opts, msg):
    with pytest.raises(DataError, match=msg):
        load_data("digits", **opts)


def test_digits_refuses_a_path():
    with pytest.raises(DataError, match="takes no path"):
        load_data("digits:/tmp")


# --------------------------------------------------------------------------- image folders


def _color(label: int, k: int) -> tuple[int, int, int]:
    return (10 * label + k, 100 + k, 200 - label)


def _write(path, rgb, size=(6, 6)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)


def _split_tree(root, n_train=3, n_test=2):
    for part, n in (("train", n_train), ("test", n_test)):
        for ci, c in enumerate(("cat", "dog")):
            for k in range(n):
                _write(root / part / c / f"{k}.png", _color(ci, k))
    return root


def test_imagefolder_split_layout_exact_pixels(tmp_path):
    s = load_data(f"imagefolder:{_split_tree(tmp_path / 'd')}")
    assert s.train.classes == ("cat", "dog") and s.train.domains is None
    assert s.train.images.shape == (6, 3, 6, 6) and s.test.images.shape == (4, 3, 6, 6)
    assert s.train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    # PNG is lossless: pixel (any) of train image k of class c is _color(c, k)
    for i, (c, k) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]):
        assert s.train.images[i, :, 3, 3].tolist() == list(_color(c, k))


def test_imagefolder_gray_resize_and_caps(tmp_path):
    root = _split_tree(tmp_path / "d", n_train=4)
    s = load_data(f"imagefolder:{root}", channels=1, image_size=4, max_per_class=2, seed=1)
    assert s.train.images.shape == (4, 1, 4, 4)
    assert (s.train.class_counts() == 2).all()
    # a flat colour stays flat through resizing; grey is Pillow's L conversion
    first = s.train.images[0]
    assert (first == first[0, 0, 0]).all()
    lum = {Image.new("RGB", (1, 1), _color(0, k)).convert("L").getpixel((0, 0)) for k in range(4)}
    assert int(first[0, 0, 0]) in lum


def test_imagefolder_domain_layout(tmp_path):
    root = tmp_path / "office"
    for d in ("art", "photo"):
        for ci, c in enumerate(("a", "b")):
            for k in range(5):
                _write(root / d / c / f"{k}.jpg", _color(ci, k))
    s = load_data(f"imagefolder:{root}", test_fraction=0.4, seed=0)
    assert s.train.domain_names == ("art", "photo") and s.train.classes == ("a", "b")
    # stratified by (domain, class): 5 -> 2 test, 3 train in every cell
    for part, n in ((s.train, 3), (s.test, 2)):
        cells = np.zeros((2, 2), int)
        np.add.at(cells, (part.domains.numpy(), part.labels.numpy()), 1)
        assert (cells == n).all()
    capped = load_data(f"imagefolder:{root}", test_fraction=0.4, max_per_class=4)
    cells = np.zeros((2, 2), int)
    np.add.at(cells, (capped.train.domains.numpy(), capped.train.labels.numpy()), 1)
    assert (cells == 2).all()  # the cap is spread over the domains


def test_imagefolder_flat_layout(tmp_path):
    root = tmp_path / "flat"
    for ci, c in enumerate(("x", "y", "z")):
        for k in range(4):
            _write(root / c / f"{k}.png", _color(ci, k))
    s = load_data(f"imagefolder:{root}", test_fraction=0.25)
    assert s.train.classes == ("x", "y", "z") and s.train.domains is None
    assert (s.train.class_counts() == 3).all() and (s.test.class_counts() == 1).all()


def test_imagefolder_sizes_must_match_or_be_resized(tmp_path):
    root = _split_tree(tmp_path / "d")
    _write(root / "train" / "cat" / "big.png", (1, 2, 3), size=(9, 7))
    with pytest.raises(DataError, match="pass image_size"):
        load_data(f"imagefolder:{root}")
    s = load_data(f"imagefolder:{root}", image_size=5)
    assert s.train.images.shape == (7, 3, 5, 5)
    other = _split_tree(tmp_path / "e")
    for f in (other / "test").rglob("*.png"):
        _write(f, (9, 9, 9), size=(7, 7))
    with pytest.raises(DataError, match=r"test images \(3, 7, 7\).*pass image_size"):
        load_data(f"imagefolder:{other}")


def test_imagefolder_missing_or_empty_or_corrupt(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_data(f"imagefolder:{tmp_path / 'nope'}")
    (tmp_path / "empty" / "c").mkdir(parents=True)
    with pytest.raises(DataError, match="no image files"):
        load_data(f"imagefolder:{tmp_path / 'empty'}")
    root = _split_tree(tmp_path / "d")
    (root / "train" / "cat" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="cannot decode"):
        load_data(f"imagefolder:{root}")


def test_imagefolder_cache_hit_and_invalidation(tmp_path, monkeypatch):
    root = _split_tree(tmp_path / "d")
    cache = tmp_path / "cache"
    first = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert len(list(cache.glob("*.safetensors"))) == 1

    def boom(*a, **k):
        raise AssertionError("decoded although cached")

    monkeypatch.setattr("osfl.data.sources.imagefolder.decode_file", boom)
    second = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert second.train.fingerprint() == first.train.fingerprint()
    assert second.test.fingerprint() == first.test.fingerprint()
    monkeypatch.undo()
    # another option, or a changed file, is another key
    load_data(f"imagefolder:{root}", cache_dir=cache, channels=1)
    f = root / "train" / "cat" / "0.png"
    _write(f, (0, 0, 0))
    os.utime(f, ns=(1, 1))
    third = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert third.train.images[0, :, 0, 0].tolist() == [0, 0, 0]
    assert len(list(cache.glob("*.safetensors"))) == 3


def test_imagefolder_torn_cache_is_rebuilt(tmp_path):
    root = _split_tree(tmp_path / "d")
    cache = tmp_path / "cache"
    ref = load_data(f"imagefolder:{root}", cache_dir=cache)
    (f,) = cache.glob("*.safetensors")
    f.write_bytes(b"\x00" * 16)
    again = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert again.train.fingerprint() == ref.train.fingerprint()


def test_common_stratified_split_and_subset_are_seeded():
    labels = np.repeat(np.arange(3), [4, 6, 1])
    tr, te = common_mod.stratified_split(labels, 0.5, seed=1)
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(11))
    assert np.bincount(labels[te], minlength=3).tolist() == [2, 3, 0]  # a singleton stays in train
    _, te = common_mod.stratified_split(np.zeros(5, int), 0.3, seed=0)
    assert len(te) == 2  # 1.5 rounds half up
    tr2, _ = common_mod.stratified_split(labels, 0.5, seed=1)
    assert np.array_equal(tr, tr2)
    sub = common_mod.balanced_subset(labels, 2, seed=0)
    assert np.bincount(labels[sub]).tolist() == [2, 2, 1]


# --------------------------------------------------------------------------- CIFAR pickles


def _cifar_rows(n: int, offset: int) -> tuple[np.ndarray, list[int]]:
    data = ((np.arange(n * 3072).reshape(n, 3072) + offset) % 251).astype(np.uint8)
    return data, [(i + offset) % 10 for i in range(n)]


def _fake_cifar10(root, n=4):
    root.mkdir()
    for i in range(1, 6):
        data, labels = _cifar_rows(n, i)
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"batch_label": b"x", b"data": data, b"labels": labels}, f)
    data, labels = _cifar_rows(n + 2, 99)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": data, b"labels": labels}, f)
    names = [f"class{i}".encode() for i in range(10)]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f)
    return root


def test_cifar10_fake_batches(tmp_path):
    root = _fake_cifar10(tmp_path / "cifar-10-batches-py")
    s = load_data(f"cifar10:{root}")
    assert s.train.images.shape == (20, 3, 32, 32) and s.test.images.shape == (6, 3, 32, 32)
    assert s.train.classes[3] == "class3"
    data, labels = _cifar_rows(4, 1)
    # row layout: 1024 red, then 1024 green, then 1024 blue values, row-major 32×32
    assert torch.equal(s.train.images[0, 1], torch.from_numpy(data[0, 1024:2048].reshape(32, 32)))
    assert s.train.labels[:4].tolist() == labels
    small = load_data(f"cifar10:{root}", image_size=16, channels=1, max_per_class=1)
    assert small.train.images.shape == (8, 1, 16, 16)  # the fake train labels cover classes 1..8


def test_cifar100_fine_and_coarse(tmp_path):
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    for part, n in (("train", 8), ("test", 4)):
        data, _ = _cifar_rows(n, 0)
        d = {
            "data": data,
            "fine_labels": list(range(n)),
            "coarse_labels": [i % 2 for i in range(n)],
        }
        with open(root / part, "wb") as f:
            pickle.dump(d, f)
    with open(root / "meta", "wb") as f:
        pickle.dump(
            {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": ["a", "b"]}, f
        )
    fine = load_data(f"cifar100:{root}")
    coarse = load_data(f"cifar100:{root}", label_mode="coarse")
    assert fine.num_classes == 100 and fine.train.labels.tolist() == list(range(8))
    assert coarse.train.classes == ("a", "b") and coarse.train.labels.tolist() == [0, 1] * 4
    with pytest.raises(DataError, match="label_mode"):
        load_data(f"cifar100:{root}", label_mode="medium")


class _Evil:
    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_cifar_malicious_pickle_is_refused_without_running(tmp_path):
    root = _fake_cifar10(tmp_path / "c")
    marker = tmp_path / "pwned"
    with open(root / "data_batch_2", "wb") as f:
        pickle.dump({b"data": _Evil(f"touch {marker}"), b"labels": []}, f)
    with pytest.raises(DataError, match=r"refusing to unpickle .*system"):
        load_data(f"cifar10:{root}")
    assert not marker.exists()
    with open(root / "data_batch_2", "wb") as f:  # eval via builtins is refused too
        pickle.dump({b"data": (eval, ("1+1",))}, f)
    with pytest.raises(DataError, match=r"refusing to unpickle builtins\.eval"):
        load_data(f"cifar10:{root}")


def test_cifar_missing_and_malformed(tmp_path):
    root = _fake_cifar10(tmp_path / "c")
    (root / "test_batch").unlink()
    with pytest.raises(DataError, match="missing CIFAR file"):
        load_data(f"cifar10:{root}")
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataError, match="N×3072"):
        load_data(f"cifar10:{root}")
    (root / "test_batch").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataError, match="cannot read CIFAR file"):
        load_data(f"cifar10:{root}")


# --------------------------------------------------------------------------- Hugging Face


def _hf_dict(classlabel: bool = True):
    datasets = pytest.importorskip("datasets")
    feats = {"img": datasets.Image()}
    feats["label"] = (
        datasets.ClassLabel(names=["neg", "pos"]) if classlabel else datasets.Value("int64")
    )

    def part(n, start):
        ims = [Image.new("RGB", (5, 5), (i * 10, 0, 0)) for i in range(start, start + n)]
        return datasets.Dataset.from_dict(
            {"img": ims, "label": [i % 2 for i in range(n)]}, features=datasets.Features(feats)
        )

    return datasets.DatasetDict({"train": part(6, 0), "test": part(4, 10)})


def test_from_hf_in_memory():
    from osfl.data import from_hf

    s = from_hf(_hf_dict(), image_size=4)
    assert s.train.classes == ("neg", "pos") and s.train.images.shape == (6, 3, 4, 4)
    assert s.train.labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert s.test.images[2, 0, 1, 1].item() == 120  # flat red (12 * 10) survives resizing
    plain = from_hf(_hf_dict(classlabel=False), test_split=None, test_fraction=0.5, channels=1)
    # 3 per class, half (1.5, rounded up) to test
    assert plain.train.classes == ("0", "1") and len(plain.train) == 2 and len(plain.test) == 4
    with pytest.raises(DataError, match="no split 'validation'"):
        from_hf(_hf_dict(), test_split="validation")
    with pytest.raises(DataError, match="no image column 'pixels'"):
        from_hf(_hf_dict(), image_column="pixels")


def test_hf_save_to_disk_round_trip(tmp_path):
    d = _hf_dict()
    d.save_to_disk(str(tmp_path / "hfset"))
    s = load_data(f"hf:{tmp_path / 'hfset'}")
    assert s.train.images.shape == (6, 3, 5, 5) and s.test.images.shape == (4, 3, 5, 5)
    assert s.test.images[:, 0, 0, 0].tolist() == [100, 110, 120, 130]
    assert s.train.name == "hfset"
