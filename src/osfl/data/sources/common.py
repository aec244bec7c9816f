"""Shared steps of every data source: option checks, resizing, channel
conversion, seeded stratified splits and class-balanced subsets, decoding image
files with Pillow, and the safetensors cache of decoded sets.

Resizing follows the usual image-classification preprocessing (antialiased
bilinear, as Pillow's ``Image.resize(..., BILINEAR)`` and torchvision's
``Resize(antialias=True)``); grayscale uses the ITU-R 601-2 luma weights that
Pillow's ``convert("L")`` uses, so tensors and files agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from osfl import jsonio
from osfl.data.imageset import DataSplits, ImageSet
from osfl.errors import DataError

log = logging.getLogger(__name__)

#: Luma weights of ITU-R 601-2 (Pillow's ``convert("L")``).
LUMA = (0.299, 0.587, 0.114)
#: Bumped when the decoded-cache layout changes, so old files are never misread.
CACHE_VERSION = 1
_RESIZE_CHUNK = 2048


def check_positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    """``value`` as an int > 0 (or None when allowed); anything else is a DataError."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise DataError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_channels(channels: Any) -> int:
    if channels not in (1, 3) or isinstance(channels, bool):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
    return int(channels)


def check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise DataError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


#: Data folders the shipped configs read as ``${oc.env:VAR,default}``: the
#: variable that names each, and its default folder (README, "Set-up").
DATA_FOLDER_VARS = {"OSFL_CIFAR10": ("CIFAR-10", "data/cifar10")}


def check_dir(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path).expanduser()
    if not str(path):
        raise DataError(f"{what}: no directory given; write the spec as '<source>:<dir>'")
    if not p.is_dir():
        raise DataError(f"{what}: directory {str(p)!r} does not exist; {_where_to_fix(p)}")
    return p


def _where_to_fix(p: Path) -> str:
    """How to point a missing data folder at the data: the environment
    variable a shipped config reads it from, or the path in the spec."""
    for var, (name, default) in DATA_FOLDER_VARS.items():
        if os.environ.get(var) and Path(os.environ[var]).expanduser() == p:
            return f"{var} names it: set {var} to your {name} image folder"
        if p == Path(default):
            return (
                f"set {var} to your {name} image folder (train/<class>/, test/<class>/), or "
                f"link it to {default} (README, Set-up)"
            )
    return "check the path in the spec"


# --------------------------------------------------------------------------- tensors


def convert_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """uint8 N×C×H×W with C in (1, 3) -> ``channels`` channels.

    Grayscale is replicated to RGB; RGB is reduced with the luma weights.
    """
    c = images.shape[1]
    if c == channels:
        return images
    if c == 1 and channels == 3:
        return images.expand(-1, 3, -1, -1).contiguous()
    if c == 3 and channels == 1:
        w = torch.tensor(LUMA, dtype=torch.float32).view(1, 3, 1, 1)
        gray = (images.float() * w).sum(1, keepdim=True)
        return gray.round_().clamp_(0, 255).to(torch.uint8)
    raise DataError(f"cannot convert {c}-channel images to {channels} channels")


def resize_images(images: torch.Tensor, size: int | None) -> torch.Tensor:
    """uint8 N×C×H×W -> N×C×size×size, antialiased bilinear, in chunks (bounded memory)."""
    if size is None or tuple(images.shape[-2:]) == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for s in range(0, images.shape[0], _RESIZE_CHUNK):
        chunk = images[s : s + _RESIZE_CHUNK].float()
        r = F.interpolate(
            chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[s : s + _RESIZE_CHUNK] = r.round_().clamp_(0, 255).to(torch.uint8)
    return out


def finish(images: torch.Tensor, *, image_size: int | None, channels: int | None) -> torch.Tensor:
    """Apply the common ``image_size`` / ``channels`` options to decoded uint8 images."""
    if channels is not None:
        images = convert_channels(images, channels)
    return resize_images(images, image_size)


# --------------------------------------------------------------------------- index selection


def stratified_split(
    strata: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``range(len(strata))`` keeping each stratum's proportion.

    ``strata`` is the class label (or a (domain, class) code for domain data).
    Each stratum of n samples puts ``n * test_fraction`` (rounded half up) in
    test, but keeps at least one sample in train. Returns sorted (train, test) indices.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        idx = idx[rng.permutation(len(idx))]
        n_test = min(int(np.floor(len(idx) * test_fraction + 0.5)), len(idx) - 1)
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    cat = lambda xs: np.sort(np.concatenate(xs)) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(train), cat(test)


def balanced_subset(
    labels: np.ndarray, max_per_class: int | None, seed: int, strata: np.ndarray | None = None
) -> np.ndarray:
    """Sorted indices keeping at most ``max_per_class`` samples per class, seeded.

    With ``strata`` (e.g. domain×class codes) the cap is spread evenly over the
    strata of each class so that every domain stays represented.
    """
    n = len(labels)
    if max_per_class is None:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    keep = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if strata is None:
            keep.append(idx[rng.permutation(len(idx))][:max_per_class])
            continue
        # round-robin over the strata of this class, each in a seeded random order
        groups = [idx[strata[idx] == s] for s in np.unique(strata[idx])]
        groups = [g[rng.permutation(len(g))] for g in groups]
        order = [g[i] for i in range(max(len(g) for g in groups)) for g in groups if i < len(g)]
        keep.append(np.asarray(order[:max_per_class], dtype=np.int64))
    return np.sort(np.concatenate(keep)) if keep else np.zeros(0, np.int64)


def make_imageset(
    images: torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    classes: Sequence[str],
    *,
    domains: np.ndarray | torch.Tensor | None = None,
    domain_names: Sequence[str] = (),
    name: str = "",
) -> ImageSet:
    return ImageSet(
        images=images.contiguous(),
        labels=torch.as_tensor(np.asarray(labels), dtype=torch.int64),
        classes=tuple(classes),
        domains=None
        if domains is None
        else torch.as_tensor(np.asarray(domains), dtype=torch.int64),
        domain_names=tuple(domain_names),
        name=name,
    )


def subset_splits(
    splits: DataSplits, max_per_class: int | None, test_max_per_class: int | None, seed: int
) -> DataSplits:
    """Apply the class-balanced caps to an already loaded train/test pair."""

    def cap(s: ImageSet, k: int | None, salt: int) -> ImageSet:
        if k is None:
            return s
        strata = None if s.domains is None else s.domains.numpy()
        return s.subset(balanced_subset(s.labels.numpy(), k, seed * 2 + salt, strata))

    return DataSplits(cap(splits.train, max_per_class, 0), cap(splits.test, test_max_per_class, 1))


#: one split's decoded pixels (uint8 N×C×H×W), labels and class names
DecodedPart = tuple[torch.Tensor, np.ndarray, Sequence[str]]


def decoded_splits(
    name: str,
    read: Callable[[str], DecodedPart],
    *,
    image_size: Any,
    channels: Any,
    max_per_class: Any,
    test_max_per_class: Any,
    seed: Any,
) -> DataSplits:
    """The train/test pair of a source whose files hold decoded pixels (CIFAR,
    MNIST, SVHN): the common options checked first, then ``read("train")`` and
    ``read("test")`` resized, converted and wrapped, then the class caps."""
    image_size = check_positive_int("image_size", image_size)
    channels = check_channels(channels)
    max_per_class = check_positive_int("max_per_class", max_per_class)
    test_max_per_class = check_positive_int("test_max_per_class", test_max_per_class)
    seed = check_seed(seed)
    parts = {}
    for part in ("train", "test"):
        images, labels, classes = read(part)
        images = finish(images, image_size=image_size, channels=channels)
        parts[part] = make_imageset(images, labels, classes, name=name)
    return subset_splits(
        DataSplits(parts["train"], parts["test"]), max_per_class, test_max_per_class, seed
    )


# --------------------------------------------------------------------------- Pillow decoding


def decode_file(
    path: str, mode: str, size: int | None, expect: tuple[int, int] | None
) -> np.ndarray:
    """One image file -> H×W×C uint8 array (mode "RGB" or "L"): :func:`decode_image`."""
    return decode_image(path, path, mode, size, expect)


def decode_image(
    source: str | IO[bytes], name: str, mode: str, size: int | None, expect: tuple[int, int] | None
) -> np.ndarray:
    """One image (a path, or a file's bytes as a stream: a pack's) -> H×W×C
    uint8 array (mode "RGB" or "L"), by the same steps either way, so a file
    gives the same array from the disk and from a pack.

    ``size`` resizes to size×size (antialiased bilinear; JPEG ``draft`` first
    so that big photos are decoded at a reduced scale, which is much faster);
    without it the image must be ``expect`` = (width, height).
    """
    try:
        with Image.open(source) as im:
            if size is not None:
                im.draft(mode, (size, size))
            im = im.convert(mode)
            if size is not None:
                if im.size != (size, size):
                    im = im.resize((size, size), Image.Resampling.BILINEAR)
            elif expect is not None and im.size != expect:
                raise DataError(
                    f"images differ in size ({name!r} is {im.size[0]}×{im.size[1]}, others "
                    f"{expect[0]}×{expect[1]}); pass image_size=<pixels> to resize them all"
                )
            arr = np.asarray(im, dtype=np.uint8)
    except DataError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise DataError(f"cannot decode image {name!r}: {e}") from e
    return arr[:, :, None] if arr.ndim == 2 else arr


def pil_to_array(im: Image.Image, mode: str, size: int | None) -> np.ndarray:
    """An in-memory PIL image -> H×W×C uint8 array (same rules as :func:`decode_file`)."""
    im = im.convert(mode)
    if size is not None and im.size != (size, size):
        im = im.resize((size, size), Image.Resampling.BILINEAR)
    arr = np.asarray(im, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def stack_hwc(arrays: Sequence[np.ndarray], what: str) -> torch.Tensor:
    """Equal-shaped H×W×C arrays -> uint8 N×C×H×W tensor (a clear error if shapes differ)."""
    if not arrays:
        raise DataError(f"{what}: no images found")
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(
            f"{what}: images differ in size ({sorted(shapes)[:3]} ...); pass image_size=<pixels>"
        )
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


# --------------------------------------------------------------------------- decoded cache


def cache_key(payload: Mapping[str, Any]) -> str:
    """A short content hash of a JSON-able description (paths, file stats, options)."""
    blob = json.dumps({"v": CACHE_VERSION, **payload}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def save_splits(path: Path, splits: DataSplits) -> None:
    """Write a DataSplits as one safetensors file (atomic: temp file + rename)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for part, s in (("train", splits.train), ("test", splits.test)):
        tensors[f"{part}.images"] = s.images.contiguous()
        tensors[f"{part}.labels"] = s.labels.contiguous()
        if s.domains is not None:
            tensors[f"{part}.domains"] = s.domains.contiguous()
        meta[part] = {
            "classes": list(s.classes),
            "domain_names": list(s.domain_names),
            "name": s.name,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"osfl_splits": json.dumps(meta)})
    os.replace(tmp, path)


def load_splits(path: Path) -> DataSplits | None:
    """Read a file written by :func:`save_splits`; None if it is unreadable (then rebuilt)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = jsonio.loads(f.metadata()["osfl_splits"])
            keys = set(f.keys())
            parts = {}
            for part in ("train", "test"):
                m = meta[part]
                dom = f.get_tensor(f"{part}.domains") if f"{part}.domains" in keys else None
                parts[part] = ImageSet(
                    images=f.get_tensor(f"{part}.images"),
                    labels=f.get_tensor(f"{part}.labels"),
                    classes=tuple(m["classes"]),
                    domains=dom,
                    domain_names=tuple(m["domain_names"]),
                    name=m["name"],
                )
    except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as e:  # torn/foreign
        log.warning("ignoring unreadable data cache %s (%s); rebuilding it", path, e)
        return None
    return DataSplits(parts["train"], parts["test"])
