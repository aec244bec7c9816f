"""The image pack a lent GPU carries (issue #40, part B): small (shared
prefixes stored once), rebuilt bit for bit, checked on read, and read from
memory by the image-folder source with the same arrays the unpacked files
give, decoding only the classes asked for, upsampling with torch on request.

Every image here is made by the test (a few 8-16 px JPEGs and PNGs); the
real CIFAR-10 numbers are in docs/gpu-suite.md (benchmarks/bench_pack_decode.py).
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from osfl.cli import main
from osfl.data import load_data
from osfl.data.classes import keep_classes
from osfl.data.imageset import DataSplits
from osfl.data.sources import pack as packfile
from osfl.data.sources.common import resize_images
from osfl.data.sources.pack import open_pack, shared_prefixes
from osfl.errors import ConfigError, DataError
from osfl.suite.pack import pack, packed_imagefolder, read_manifest, unpack_imagefolder

CLASSES = ("cat", "dog", "frog")


def _folder(root: Path, per_class: int = 4, size: int = 16) -> Path:
    """``train/`` and ``test/`` of three classes: JPEGs of one size and quality
    (one shared header, as CIFAR-10's), plus odd files that share nothing:
    a PNG and a JPEG of another quality in every class of train."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in CLASSES:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                img = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
                img.save(d / f"{i:04d}.jpg", quality=90)
            if split == "train":
                img = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
                img.save(d / "odd.png")
                img.save(d / "odd_q50.jpg", quality=50)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.glob("*/*/*")}


def _same(a: DataSplits, b: DataSplits) -> None:
    for x, y in ((a.train, b.train), (a.test, b.test)):
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)
        assert x.classes == y.classes


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the source folder, its pack file)."""
    tmp = tmp_path_factory.mktemp("pack")
    src = _folder(tmp / "cifar")
    pack(tmp / "gpu_pack", cifar10=src)
    return src, tmp / "gpu_pack" / "cifar10.npz"


# --------------------------------------------------------------------------- size, bits


def test_shared_headers_are_stored_once_and_every_file_rebuilds_bit_for_bit(
    packed: tuple[Path, Path], tmp_path: Path
) -> None:
    src, pack_file = packed
    files = _files(src)
    jpegs = [b for k, b in files.items() if k.endswith(".jpg") and "odd" not in k]
    header = len(packfile.shared_prefixes(jpegs)[0][1])
    assert header > 300  # Pillow's JPEGs of one size and quality share their tables
    opened = open_pack(pack_file)
    assert opened.files() == files  # every file, the odd ones included, bit for bit
    opened.verify()
    with np.load(pack_file, allow_pickle=False) as z:  # pickle-free: plain numbers only
        assert all(z[k].dtype.kind in "iu" for k in z.files)
        stored = z["prefixes"].size + z["train_bytes"].size + z["test_bytes"].size
    # the shared header is stored once, not once per JPEG
    assert stored <= sum(map(len, files.values())) - (len(jpegs) - 1) * header
    out = unpack_imagefolder(pack_file, tmp_path / "unpacked")
    assert _files(out) == files


def test_a_file_with_another_header_still_round_trips() -> None:
    a = b"\xff\xd8HEADER-one" * 20
    blobs = [a + bytes([i]) * 30 for i in range(6)] + [b"PNG-other" * 5, a[:7], b""]
    prefixes, ids = shared_prefixes(blobs)
    assert len(prefixes[1]) >= len(a)  # the six share at least the header
    assert {int(i) for i in ids[6:]} == {0}  # the odd ones keep the empty prefix
    for blob, i in zip(blobs, ids.tolist(), strict=True):
        assert blob.startswith(prefixes[i])


# --------------------------------------------------------------------------- damage


def _rewrite(pack_file: Path, out: Path, **changes: np.ndarray) -> Path:
    """The pack with some arrays replaced (and its payload sha256 recomputed,
    so only the structural checks can catch it)."""
    with np.load(pack_file, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    index = json.loads(arrays["index"].tobytes())
    index["payload_sha256"] = packfile._payload_sha256(arrays)
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    np.savez(out, **arrays)
    return out


def test_a_damaged_or_truncated_pack_is_one_data_error(
    packed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, pack_file = packed
    raw = pack_file.read_bytes()
    with np.load(pack_file, allow_pickle=False) as z:
        offsets, prefix = z["train_offsets"], z["train_prefix"]
    cases = {
        "truncated": raw[: len(raw) // 2],
        "empty": b"",
        "flipped": raw[:300] + bytes([raw[300] ^ 0xFF]) + raw[301:],
        "not a pack": b"hello, world",
    }
    bad = {name: tmp_path / f"{name.replace(' ', '_')}.npz" for name in cases}
    for name, data in cases.items():
        bad[name].write_bytes(data)
    shifted = offsets.copy()
    shifted[3] = shifted[5]
    bad["offsets"] = _rewrite(pack_file, tmp_path / "offsets.npz", train_offsets=shifted)
    bad["short"] = _rewrite(pack_file, tmp_path / "short.npz", train_offsets=offsets[:-1])
    bad["prefix"] = _rewrite(pack_file, tmp_path / "prefix.npz", train_prefix=prefix + 9)
    escape = np.frombuffer(zlib.compress(b"../../x/y"), dtype=np.uint8)
    bad["path"] = _rewrite(pack_file, tmp_path / "path.npz", test_paths=escape)
    np.save(tmp_path / "array.npy", np.zeros(3))
    bad["npy"] = (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    for name, path in bad.items():
        with pytest.raises(DataError) as e:
            load_data(f"imagefolder:{path}")
        assert "\n" not in str(e.value) and str(path) in str(e.value), name
    with pytest.raises(SystemExit) as e:  # the command line: one line, exit 2
        main(["partition", "--dataset", f"imagefolder:{bad['truncated']}", "--scheme", "iid",
              "--clients", "2", "--out", str(tmp_path / "fed.json")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "damaged" in err
    # the rebuilt files are checked against the packer's digest as well
    index = json.loads(np.load(pack_file, allow_pickle=False)["index"].tobytes())
    index["splits"]["test"]["sha256"] = "0" * 64
    with np.load(pack_file, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    np.savez(tmp_path / "digest.npz", **arrays)
    with pytest.raises(DataError, match="do not rebuild"):
        unpack_imagefolder(tmp_path / "digest.npz", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_the_suite_refuses_a_damaged_pack_folder_in_one_line(tmp_path: Path) -> None:
    pack(tmp_path / "p", cifar10=_folder(tmp_path / "cifar", per_class=1))
    assert packed_imagefolder(tmp_path / "p") == tmp_path / "p" / "cifar10.npz"
    with zipfile.ZipFile(tmp_path / "p" / "cifar10.npz", "a") as z:
        z.writestr("extra.npy", b"")
    with pytest.raises(DataError, match="differs"):
        packed_imagefolder(tmp_path / "p")


# --------------------------------------------------------------------------- reading


def test_the_pack_reads_as_the_unpacked_folder_from_memory(
    packed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, pack_file = packed
    folder = unpack_imagefolder(pack_file, tmp_path / "cifar")
    for opts in (
        {},
        {"image_size": 12},  # Pillow's downsample, JPEG draft included
        {"channels": 1, "max_per_class": 3, "test_max_per_class": 2, "seed": 3},
        {"num_workers": 1},
    ):
        a = load_data(f"imagefolder:{folder}", **opts)
        b = load_data(f"imagefolder:{pack_file}", **opts)
        _same(a, b)
        assert b.train.name == a.train.name == "cifar"
    # the decoded cache is keyed by the pack's content
    first = load_data(f"imagefolder:{pack_file}", cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1
    _same(first, load_data(f"imagefolder:{pack_file}", cache_dir=str(tmp_path / "cache")))


def test_only_the_classes_asked_for_are_decoded(
    packed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, pack_file = packed
    decoded: list[str] = []
    real = packfile.decode_blob
    monkeypatch.setattr(
        packfile, "decode_blob", lambda data, name, *a: decoded.append(name) or real(data, name, *a)
    )
    opts = {"max_per_class": 4, "test_max_per_class": 3, "seed": 1}
    part = load_data(f"imagefolder:{pack_file}", classes=["frog", "0"], **opts)
    assert decoded and all("/frog/" in n or "/cat/" in n for n in decoded)
    assert part.train.classes == CLASSES  # the folder's label space: data.classes still applies
    full = load_data(f"imagefolder:{src}", **opts)
    _same(keep_classes(part, ["frog", "cat"], "x"), keep_classes(full, ["frog", "cat"], "x"))
    # the same option reads the folder too, with the same samples
    _same(part, load_data(f"imagefolder:{src}", classes=["frog", "0"], **opts))
    with pytest.raises(ConfigError, match="not in"):
        load_data(f"imagefolder:{pack_file}", classes=["horse", "cat"])


def test_upsampling_with_torch_is_an_option_and_the_cpu_default_stays_pillow(
    packed: tuple[Path, Path],
) -> None:
    src, pack_file = packed
    opts = {"image_size": 40, "max_per_class": 2, "test_max_per_class": 2}
    pillow = load_data(f"imagefolder:{src}", resize="pillow", **opts)
    if not torch.cuda.is_available():  # auto: Pillow on a machine without CUDA, as before
        _same(load_data(f"imagefolder:{pack_file}", **opts), pillow)
    by_torch = load_data(f"imagefolder:{pack_file}", resize="torch", **opts)
    native = load_data(f"imagefolder:{src}", max_per_class=2, test_max_per_class=2)
    assert torch.equal(by_torch.train.images, resize_images(native.train.images, 40))
    diff = (by_torch.train.images.int() - pillow.train.images.int()).abs()
    assert 0 < int(diff.max()) <= 2  # Pillow rounds between its two passes; torch does not
    # a downsample keeps Pillow (its JPEG draft), whatever the option
    small = {"image_size": 8, "max_per_class": 2, "test_max_per_class": 2}
    _same(
        load_data(f"imagefolder:{pack_file}", resize="torch", **small),
        load_data(f"imagefolder:{src}", **small),
    )
    with pytest.raises(DataError, match="resize must be"):
        load_data(f"imagefolder:{pack_file}", resize="gpu", image_size=40)


def test_a_first_format_pack_is_still_read(packed: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = packed
    arrays = {}
    for split in ("train", "test"):
        paths = sorted(k for k in _files(src) if k.startswith(split + "/"))
        blobs = [(src / p).read_bytes() for p in paths]
        arrays[f"{split}_bytes"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        arrays[f"{split}_offsets"] = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
        arrays[f"{split}_paths"] = np.frombuffer("\n".join(paths).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", **arrays)
    _same(load_data(f"imagefolder:{tmp_path / 'old.npz'}"), load_data(f"imagefolder:{src}"))
    assert unpack_imagefolder(tmp_path / "old.npz", tmp_path / "u") and _files(
        tmp_path / "u"
    ) == _files(src)


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize("bad", ["-1", "0"])
def test_pack_refuses_a_non_positive_max_per_class_and_leaves_no_folder(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _folder(tmp_path / "cifar", per_class=1)
    with pytest.raises(SystemExit) as e:
        main(["suite", "pack", "--cifar10", str(src), "--out", str(tmp_path / "out"),
              "--max-per-class", bad])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--max-per-class must be a positive" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_refused_pack_leaves_nothing_behind_and_an_old_pack_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _folder(tmp_path / "cifar", per_class=1)
    with pytest.raises(SystemExit) as e:
        main(["suite", "pack", "--cifar10", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "does not exist" in err
    assert not (tmp_path / "out").exists()
    old = pack(tmp_path / "out", cifar10=src)
    (tmp_path / "out" / "mine.txt").write_text("kept")
    with pytest.raises(ConfigError, match="over the"):
        pack(tmp_path / "out", cifar10=src, limit_bytes=100)
    assert read_manifest(tmp_path / "out") == old
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "MANIFEST.json",
        "cifar10.npz",
        "mine.txt",
    ]
    assert not list(tmp_path.glob("*.packing"))


def test_auto_upsamples_on_the_accelerator_when_there_is_one(
    packed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where CUDA is available ``resize=auto`` runs torch's op there: on the
    simulated accelerator (tests/support/simulated_device.py) every op of the upsample
    stays on one device and the images come back to the CPU, as on the CPU."""
    from osfl.data.sources import imagefolder
    from support.simulated_device import simulated_device

    _, pack_file = packed
    opts = {"image_size": 40, "max_per_class": 2, "test_max_per_class": 2}
    on_cpu = load_data(f"imagefolder:{pack_file}", resize="torch", **opts)
    with simulated_device() as dev:
        monkeypatch.setattr(imagefolder, "_resize_device", lambda resize: dev)
        on_dev = load_data(f"imagefolder:{pack_file}", **opts)
    assert on_dev.train.images.device.type == "cpu"
    _same(on_dev, on_cpu)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"files": {"cifar10.npz": 3}}',
        '{"files": {"../x": {"bytes": 1, "sha256": "0"}}}',
    ],
)
def test_a_damaged_manifest_is_one_data_error(tmp_path: Path, text: str) -> None:
    pack(tmp_path / "p", cifar10=_folder(tmp_path / "cifar", per_class=1))
    (tmp_path / "p" / "MANIFEST.json").write_text(text)
    with pytest.raises(DataError) as e:
        packed_imagefolder(tmp_path / "p")
    assert "\n" not in str(e.value) and "MANIFEST.json" in str(e.value)
