"""``imagefolder:<dir>``: image files in one folder per class (the layout of
torchvision's ``ImageFolder``, used by CIFAR dumps, Tiny-ImageNet, OfficeHome
(Venkateswara et al., 2017) and PACS (Li et al., 2017)).

Three layouts are recognised:

- ``<dir>/train/<class>/*`` and ``<dir>/test/<class>/*``: the given split;
- ``<dir>/<domain>/<class>/*`` (OfficeHome, PACS): domains recorded, a seeded
  split stratified by (domain, class);
- ``<dir>/<class>/*``: one domain, a seeded split stratified by class.

Files are decoded once with Pillow in a thread pool (Pillow releases the GIL
while decoding) and the uint8 tensors cached as safetensors in ``cache_dir``,
keyed by the directory, every file's name, size and mtime, and the options:
a second load of 60,000 CIFAR-10 JPEGs reads one file instead of decoding.

``imagefolder:<pack>.npz`` reads an image pack (``osfl suite pack``,
:mod:`osfl.data.sources.pack`) as the folder it holds, from memory: the same
listing, splits, subsets and arrays, nothing written back to disk. Two options
serve a lent GPU's short jobs: ``classes`` decodes only those classes' images
(the label space stays the folder's, so ``data.classes`` selects the same
samples as from a full load) and ``resize`` upsamples with torch on the GPU
(``auto``: when CUDA is available; Pillow otherwise, as before).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osfl.data.classes import resolve_classes
from osfl.data.imageset import DataSplits
from osfl.data.sources.common import (
    balanced_subset,
    cache_key,
    check_channels,
    check_dir,
    check_fraction,
    check_positive_int,
    check_seed,
    decode_file,
    load_splits,
    make_imageset,
    save_splits,
    stratified_split,
)
from osfl.data.sources.pack import Decoder, ImagePack, is_pack_file, open_pack, pack_decoder
from osfl.data.sources.pack import resize_device as _resize_device
from osfl.data.sources.pack import upsample as _upsample
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
)
_CHUNK = 256  # files per decoding task: large enough to amortise scheduling


@dataclass(frozen=True)
class _Listing:
    """What the directory holds: files (relative paths), labels, domains, splits."""

    files: list[str]
    labels: np.ndarray
    domains: np.ndarray | None
    is_test: np.ndarray | None  # None: no given split
    classes: tuple[str, ...]
    domain_names: tuple[str, ...]


def _subdirs(p: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(p) if e.is_dir() and not e.name.startswith("."))


def _images(p: Path) -> list[str]:
    return sorted(
        e.name
        for e in os.scandir(p)
        if e.is_file()
        and not e.name.startswith(".")
        and Path(e.name).suffix.lower() in IMAGE_EXTENSIONS
    )


def test_only_folder(spec: str) -> Path | None:
    """The ``test/`` folder of ``imagefolder:<dir>`` when ``<dir>`` holds a
    ``test/`` and no ``train/`` (else ``None``). Loaded as a tree it would be
    one domain named "test", split 80/20 like any other; ``osfl eval --data``
    scores such a folder in full instead (issue 52: the user's test data)."""
    prefix, _, path = spec.strip().partition(":")
    if prefix.strip() != "imagefolder" or not path or is_pack_file(path):
        return None
    root = Path(path).expanduser()
    if (root / "test").is_dir() and not (root / "train").exists():
        return root / "test"
    return None


def _scan(root: Path) -> _Listing:
    """Detect the layout and list every image file, in a deterministic order."""
    top = _subdirs(root)
    if "train" in top and "test" in top:
        listing = _scan_split(root)
    elif top and all(not _images(root / d) and _subdirs(root / d) for d in top):
        listing = _scan_domains(root, top)
    else:
        listing = _scan_classes(root, top)
    _check_listing(root, listing)
    return listing


def _scan_split(root: Path) -> _Listing:
    """``train/<class>/*`` and ``test/<class>/*``: the given split is kept; the
    classes are train's (a test class train lacks could never be learnt)."""
    files: list[str] = []
    labels: list[int] = []
    tests: list[bool] = []
    classes = tuple(_subdirs(root / "train"))
    extra = sorted(set(_subdirs(root / "test")) - set(classes))
    if extra:
        raise DataError(f"{root}/test has classes missing from train: {extra[:5]}; fix the folders")
    for part in ("train", "test"):
        for ci, c in enumerate(classes):
            if not (root / part / c).is_dir():
                continue
            for f in _images(root / part / c):
                files.append(f"{part}/{c}/{f}")
                labels.append(ci)
                tests.append(part == "test")
    return _Listing(files, np.asarray(labels, np.int64), None, np.asarray(tests), classes, ())


def _scan_domains(root: Path, top: list[str]) -> _Listing:
    """``<domain>/<class>/*``: every top folder holds only class folders; the
    classes are the union over domains, so a domain may lack some."""
    files: list[str] = []
    labels: list[int] = []
    doms: list[int] = []
    domain_names = tuple(top)
    classes = tuple(sorted({c for d in top for c in _subdirs(root / d)}))
    for di, d in enumerate(domain_names):
        for c in _subdirs(root / d):
            for f in _images(root / d / c):
                files.append(f"{d}/{c}/{f}")
                labels.append(classes.index(c))
                doms.append(di)
    return _Listing(
        files,
        np.asarray(labels, np.int64),
        np.asarray(doms, np.int64),
        None,
        classes,
        domain_names,
    )


def _scan_classes(root: Path, top: list[str]) -> _Listing:
    """``<class>/*``: one folder per class, no split, no domains."""
    files: list[str] = []
    labels: list[int] = []
    classes = tuple(top)
    for ci, c in enumerate(classes):
        for f in _images(root / c):
            files.append(f"{c}/{f}")
            labels.append(ci)
    return _Listing(files, np.asarray(labels, np.int64), None, None, classes, ())


def _check_listing(root: Path, listing: _Listing) -> None:
    """A folder with no images, a class folder without (training) images, or
    images of one class only, is a layout mistake: say what to fix."""
    files = listing.files
    if not files:
        raise DataError(
            f"no image files under {str(root)!r}; expected train/<class>/*, test/<class>/*, "
            f"<domain>/<class>/* or <class>/* with extensions {sorted(IMAGE_EXTENSIONS)}"
        )
    train = listing.labels if listing.is_test is None else listing.labels[~listing.is_test]
    counts = np.bincount(train, minlength=len(listing.classes))
    empty = [c for c, n in zip(listing.classes, counts.tolist(), strict=True) if n == 0]
    if empty:
        where = "train/" if listing.is_test is not None else ""
        raise DataError(
            f"{str(root)!r}: class folder(s) {where}{', '.join(empty[:5])} hold no "
            f"{'training ' if where else ''}images (extensions {sorted(IMAGE_EXTENSIONS)}); "
            "an empty folder would be a class no client can learn: add images or remove it"
        )
    used = sorted({listing.classes[i] for i in listing.labels.tolist()})
    if len(used) < 2:
        raise DataError(
            f"{str(root)!r} holds {len(files)} image(s) in {len(used)} class folder(s) "
            f"({', '.join(used[:3])}); an image folder needs at least two classes laid out as "
            "train/<class>/*, test/<class>/*, <domain>/<class>/* or <class>/*"
        )


def _file_stats(root: Path, files: list[str]) -> list[tuple[str, int, int]]:
    out = []
    for f in files:
        st = os.stat(root / f)
        out.append((f, st.st_size, st.st_mtime_ns))
    return out


def _pack_listing(pack: ImagePack) -> _Listing:
    """What the folder unpacked from ``pack`` would list (:func:`_scan_split`)."""
    by_dir: dict[tuple[str, str], list[str]] = {}
    for rel in pack.paths():
        part, c, f = rel.split("/")
        if not c.startswith("."):
            names = by_dir.setdefault((part, c), [])
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                names.append(f)
    classes = tuple(sorted(c for part, c in by_dir if part == "train"))
    extra = sorted({c for part, c in by_dir if part == "test"} - set(classes))
    if extra:
        raise DataError(f"{pack.path}: test has classes missing from train: {extra[:5]}")
    files: list[str] = []
    labels: list[int] = []
    tests: list[bool] = []
    for part in ("train", "test"):
        for ci, c in enumerate(classes):
            for f in sorted(by_dir.get((part, c), [])):
                files.append(f"{part}/{c}/{f}")
                labels.append(ci)
                tests.append(part == "test")
    return _Listing(files, np.asarray(labels, np.int64), None, np.asarray(tests), classes, ())


def _folder_decoder(root: Path) -> Decoder:
    return lambda rel, *a: decode_file(str(root / rel), *a)


def _decode_all(
    root: Path,
    files: list[str],
    mode: str,
    size: int | None,
    num_workers: int,
    decode: Decoder | None = None,
) -> torch.Tensor:
    """Decode ``files`` into one uint8 N×C×H×W tensor, chunks in parallel threads
    (``decode(rel, mode, size, expect)``: from a pack; default: the files under ``root``)."""
    decode = decode or _folder_decoder(root)
    first = decode(files[0], mode, size, None)
    expect = None if size is not None else (first.shape[1], first.shape[0])
    out = np.empty((len(files), *first.shape), dtype=np.uint8)

    def work(start: int) -> None:
        for i in range(start, min(start + _CHUNK, len(files))):
            out[i] = decode(files[i], mode, size, expect)

    starts = range(0, len(files), _CHUNK)
    if num_workers <= 1:
        for s in starts:
            work(s)
    else:
        with ThreadPoolExecutor(max_workers=num_workers) as pool:
            list(pool.map(work, starts))  # list() re-raises the first worker error
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def _decode_images(
    root: Path,
    files: list[str],
    mode: str,
    size: int | None,
    workers: int,
    decode: Decoder,
    device: torch.device | None,
) -> torch.Tensor:
    """:func:`_decode_all`, with an upsample done by torch on ``device`` when
    one is given (files decoded at their own size, all of one size); Pillow
    resizes otherwise, as before."""
    if device is not None and size is not None:
        h, w, _ = decode(files[0], mode, None, None).shape
        if h <= size and w <= size:  # an upsample: torch on the device
            try:
                native = _decode_all(root, files, mode, None, workers, decode)
            except DataError:  # sizes differ: Pillow below resizes each, as before
                native = None
            if native is not None:
                return _upsample(native, size, device)
    return _decode_all(root, files, mode, size, workers, decode)


def _workers(num_workers: int | None, from_pack: bool) -> int:
    """Decoding threads: the user's, else 8 at most from disk, every core from a pack."""
    workers = check_positive_int("num_workers", num_workers) or min(8, os.cpu_count() or 1)
    if from_pack and num_workers is None:
        workers = os.cpu_count() or 1  # from memory: every core decodes
    return workers


def _wanted_classes(
    classes: list[str | int] | None, listing: _Listing, path: str
) -> np.ndarray | list[int] | None:
    """The class indices ``classes`` names (``None``: every class)."""
    if classes is None:
        return None
    if isinstance(classes, (str, int)):
        raise DataError(f"classes must be a list of class names or indices, got {classes!r}")
    return resolve_classes(list(classes), listing.classes, f"imagefolder:{path}")


def _split_indices(
    listing: _Listing, options: dict[str, Any], wanted: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The train and test samples: the tree's split (else a seeded stratified
    one), each capped per class, then only the wanted classes."""
    seed = options["seed"]
    # strata: (domain, class) where domains exist, so the split and caps keep every domain
    strata = (
        listing.labels if listing.domains is None else listing.domains * 100_000 + listing.labels
    )
    if listing.is_test is not None:
        train_idx, test_idx = np.flatnonzero(~listing.is_test), np.flatnonzero(listing.is_test)
    else:
        train_idx, test_idx = stratified_split(strata, options["test_fraction"], seed)
    train_idx = train_idx[
        balanced_subset(
            listing.labels[train_idx], options["max_per_class"], seed * 2, strata[train_idx]
        )
    ]
    test_idx = test_idx[
        balanced_subset(
            listing.labels[test_idx], options["test_max_per_class"], seed * 2 + 1, strata[test_idx]
        )
    ]
    if wanted is not None:  # after the subsets: the same samples as a full load keeps
        train_idx = train_idx[np.isin(listing.labels[train_idx], wanted)]
        test_idx = test_idx[np.isin(listing.labels[test_idx], wanted)]
    return train_idx, test_idx


def _cache_file(
    cache_dir: str | os.PathLike[str] | None,
    root: Path,
    pack: ImagePack | None,
    listing: _Listing,
    options: dict[str, Any],
) -> Path | None:
    """Where the decoded splits are cached: keyed by the files (or the pack's
    digest) and every option that changes a pixel."""
    if cache_dir is None:
        return None
    content = {"pack": pack.digest} if pack else {"files": _file_stats(root, listing.files)}
    key = cache_key({"root": str(root), **content, **options})
    name = pack.name if pack else root.name
    return Path(cache_dir).expanduser() / f"imagefolder-{name}-{key}.safetensors"


def _open(path: str) -> tuple[ImagePack | None, Path, _Listing]:
    """The pack file at ``path`` (its listing checked), or the tree there."""
    if is_pack_file(path):
        pack = open_pack(path)
        root = pack.path.resolve()
        listing = _pack_listing(pack)
        _check_listing(root, listing)
        return pack, root, listing
    root = check_dir(path, "imagefolder").resolve()
    return None, root, _scan(root)


def _cached(cache_file: Path) -> DataSplits | None:
    return load_splits(cache_file) if cache_file.is_file() else None


@register_dataset("imagefolder")
def load_imagefolder(
    path: str,
    *,
    image_size: int | None = None,
    channels: int = 3,
    test_fraction: float = 0.2,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    num_workers: int | None = None,
    classes: list[str | int] | None = None,
    resize: str = "auto",
) -> DataSplits:
    """Load an image-folder tree (see the module docstring for the layouts),
    or the pack file of one.

    ``image_size`` resizes every image to a square (required unless all files
    share one size); ``max_per_class`` / ``test_max_per_class`` keep a seeded,
    class-balanced subset (spread over domains) and only those files are
    decoded; ``test_fraction`` is used where the tree has no train/test split;
    ``classes`` (names or indices) decodes only those classes' samples of
    that subset; ``resize`` (auto, pillow, torch) says where images are upsampled.
    """
    pack, root, listing = _open(path)
    image_size = check_positive_int("image_size", image_size)
    channels = check_channels(channels)
    test_fraction = check_fraction("test_fraction", test_fraction)
    max_per_class = check_positive_int("max_per_class", max_per_class)
    test_max_per_class = check_positive_int("test_max_per_class", test_max_per_class)
    seed = check_seed(seed)
    workers = _workers(num_workers, pack is not None)
    on_device = _resize_device(resize)  # checked even where nothing is resized
    on_device = on_device if image_size is not None else None

    options = {
        "image_size": image_size,
        "channels": channels,
        "test_fraction": test_fraction,
        "max_per_class": max_per_class,
        "test_max_per_class": test_max_per_class,
        "seed": seed,
    }
    wanted = _wanted_classes(classes, listing, path)
    if wanted is not None:
        options["classes"] = sorted(wanted)
    if on_device is not None:
        options["resize"] = "torch"
    name = pack.name if pack else root.name
    cache_file = _cache_file(cache_dir, root, pack, listing, options)
    if cache_file is not None and (cached := _cached(cache_file)) is not None:
        log.info("loaded decoded %s from cache %s", root, cache_file)
        return cached

    train_idx, test_idx = _split_indices(listing, options, wanted)

    mode = "RGB" if channels == 3 else "L"
    t0 = time.perf_counter()
    decode = pack_decoder(pack) if pack else _folder_decoder(root)

    def part(idx: np.ndarray, which: str):
        if len(idx) == 0:
            raise DataError(
                f"no {which} images in {str(root)!r} after splitting/subsetting; add images, "
                f"raise test_fraction or the per-class caps"
            )
        return make_imageset(
            _decode_images(
                root, [listing.files[i] for i in idx], mode, image_size, workers, decode, on_device
            ),
            listing.labels[idx],
            listing.classes,
            domains=None if listing.domains is None else listing.domains[idx],
            domain_names=listing.domain_names,
            name=name,
        )

    splits = DataSplits(part(train_idx, "train"), part(test_idx, "test"))
    if splits.train.image_shape != splits.test.image_shape:
        raise DataError(
            f"train images are {splits.train.image_shape} but test images {splits.test.image_shape} "
            f"(C, H, W); pass image_size=<pixels> to resize them all"
        )
    log.info(
        "decoded %d images from %s in %.1fs",
        len(train_idx) + len(test_idx),
        root,
        time.perf_counter() - t0,
    )
    if cache_file is not None:
        save_splits(cache_file, splits)
        log.info("cached decoded %s at %s", root, cache_file)
    return splits
