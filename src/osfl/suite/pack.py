"""What a lent GPU machine needs, carried in one ignored folder of the repo
(issue #32): nothing can be downloaded there, and the working tree travels
with at most 64 MiB of ignored paths.

``osfl suite pack`` writes ``gpu_pack/`` (``.gitignore``d):

- ``cifar10.npz``: an image folder (``OSFL_CIFAR10``: ``train/`` and ``test/``,
  one folder per class) as an image pack (:mod:`osfl.data.sources.pack`): the
  files' shared prefixes once (all CIFAR-10 JPEGs share a 623-byte header),
  each file's remainder, offsets and paths, no pickle. The images are not
  re-encoded: prefix + remainder is each file bit for bit, so a run gives
  the images the cpu rows decoded. CIFAR-10 (60,000 JPEGs of 32 px, 52.7 MiB
  of files) packs into 17.7 MiB; as raw uint8 it would be 175.8 MiB
  (``max_per_class`` packs a subset when a larger folder does not fit);
- ``pretrained/``: weights files with their model cards (``NAME.card.json``);
- ``wheels/``: the Python packages osfl imports that the lent machine's image
  lacks (:data:`LENT_MACHINE_LACKS`, at the versions installed here), for
  ``pip install --no-index --target``: its python3 holds torch, numpy,
  safetensors, rich, torchmetrics, scipy, scikit-learn, matplotlib, but not
  these (seen on an H200 lent on 2026-11-25);
- ``MANIFEST.json``: every file's bytes and sha256, the total, the limit.

The suite checks it with :func:`packed_imagefolder` and points
``OSFL_CIFAR10`` at the pack file itself: ``imagefolder:<file>.npz`` reads
it from memory, so every config reads it unchanged and nothing is written
back to disk. :func:`unpack_imagefolder` still writes the folder back (once,
each file checked against the packer's sha256) for tools that want files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from osfl.data.sources.imagefolder import IMAGE_EXTENSIONS
from osfl.data.sources.pack import open_pack, write_pack
from osfl.errors import ConfigError, DataError
from osfl.jsonio import loads

#: What a lent machine carries at most (the run tool's limit on ignored paths).
LIMIT_BYTES = 64 * 2**20
#: The largest ``MANIFEST.json`` read (a pack's lists a few hundred files).
MANIFEST_LIMIT = 16 * 2**20
#: The packed folder, relative to the repository root.
PACK_DIR = "gpu_pack"
SPLITS = ("train", "test")
#: What the lent machine's image lacks of the packages the suite's commands
#: import (Flower and cryptography serve deployments only and are not imported
#: there); ``datasets``, ``dill`` and ``multiprocess`` come with flwr-datasets.
LENT_MACHINE_LACKS = ("omegaconf", "flwr-datasets", "datasets", "dill", "multiprocess")
#: The lent machine's Python (its wheels must match it).
LENT_PYTHON = "3.12"
_LENT_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def sha256_file(path: Path) -> str:
    """A file's sha256, read in 1 MiB chunks (packs and step outputs are large)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _listing(root: Path, split: str, max_per_class: int | None) -> list[str]:
    """Relative paths of a split's images, sorted (class, then file), at most
    ``max_per_class`` per class (the first in that order): the files the
    image-folder source reads (no hidden names, its image extensions)."""
    base = root / split
    if not base.is_dir():
        raise DataError(f"{base} is not a folder: an image folder needs train/ and test/")
    out: list[str] = []
    for cls in sorted(p.name for p in base.iterdir() if p.is_dir()):
        if cls.startswith("."):
            continue
        files = sorted(
            p.name
            for p in (base / cls).iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        out += [f"{split}/{cls}/{name}" for name in files[:max_per_class]]
    if not out:
        raise DataError(f"{base} holds no images")
    return out


def check_max_per_class(value: Any) -> int | None:
    """``--max-per-class``: a positive count or none (``0`` or ``-1`` would
    silently pack nothing or drop each class's last file)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"--max-per-class must be a positive number of images, got {value!r}")
    return int(value)


def pack_imagefolder(
    root: str | os.PathLike[str], out: str | os.PathLike[str], *, max_per_class: int | None = None
) -> dict[str, Any]:
    """Pack the image folder ``root`` into the pack file ``out`` (the files'
    bytes, shared prefixes stored once); returns its manifest entry (images
    per split, the files' own bytes, the pack's bytes and sha256)."""
    root, out = Path(root), Path(out)
    max_per_class = check_max_per_class(max_per_class)
    if not root.is_dir():
        raise DataError(f"the CIFAR-10 image folder {root} does not exist")
    files = {}
    for split in SPLITS:
        paths = _listing(root, split, max_per_class)
        files[split] = [(p, (root / p).read_bytes()) for p in paths]
    write_pack(out, files, name=root.resolve().name)
    counts = {split: len(files[split]) for split in SPLITS}
    raw = sum(len(b) for split in SPLITS for _, b in files[split])
    return {"images": counts, "max_per_class": max_per_class, "file_bytes": raw, **_file_entry(out)}


def _file_entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def packed_imagefolder(pack_dir: str | os.PathLike[str]) -> Path | None:
    """The checked image pack of the pack folder ``pack_dir`` (``None``: it
    packs no images), for ``OSFL_CIFAR10``: ``imagefolder:<that file>``
    reads the images from memory, nothing unpacked.

    The manifest's sizes and sha256 (:func:`read_manifest`) and the pack's
    own offsets, prefixes, paths and sha256 are checked here, so a damaged
    pack stops the suite with one line before any step runs."""
    manifest = read_manifest(pack_dir)
    if manifest is None:
        raise DataError(f"{pack_dir} holds no pack (no MANIFEST.json): run `osfl suite pack`")
    if "cifar10.npz" not in manifest["files"]:
        return None
    path = Path(pack_dir) / "cifar10.npz"
    open_pack(path).verify()
    return path


def unpack_imagefolder(pack: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Write the image folder packed in ``pack`` under ``dest`` (once: a
    ``.packed-sha256`` stamp names the pack it came from) and return ``dest``;
    every file is checked against the sha256 the packer wrote."""
    pack, dest = Path(pack), Path(dest)
    digest = sha256_file(pack)
    stamp = dest / ".packed-sha256"
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return dest
    opened = open_pack(pack)
    opened.verify()
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".unpacking")
    if tmp.exists():
        shutil.rmtree(tmp)
    for rel, blob in opened.files().items():  # paths checked by open_pack: split/class/file
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    tmp.rename(dest)
    stamp.write_text(digest + "\n")
    return dest


def wheel_download_command(dest: str | os.PathLike[str]) -> list[str]:
    """``pip download`` of :data:`LENT_MACHINE_LACKS` into ``dest``: binary
    wheels for the lent machine's Python and platform, each at the version
    installed here (so the machine runs what the tests ran), no dependencies
    (the machine has the rest)."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in LENT_MACHINE_LACKS]
    platforms = [a for p in _LENT_PLATFORMS for a in ("--platform", p)]
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        LENT_PYTHON,
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        *pins,
    ]


def download_lent_wheels(dest: Path) -> list[Path]:
    """The wheels a lent machine lacks (:func:`wheel_download_command`),
    downloaded into ``dest`` from the package index this machine reaches."""
    done = subprocess.run(wheel_download_command(dest), capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"pip download of the lent machine's wheels failed:\n{done.stderr}")
    return sorted(dest.glob("*.whl"))


def pack(
    out: str | os.PathLike[str],
    *,
    cifar10: str | os.PathLike[str] | None,
    weights: Iterable[str | os.PathLike[str]] = (),
    wheels: Iterable[str | os.PathLike[str]] = (),
    max_per_class: int | None = None,
    limit_bytes: int = LIMIT_BYTES,
) -> dict[str, Any]:
    """Write the pack folder ``out``: the image folder ``cifar10`` (if given),
    every weights file with its card, and the ``wheels`` files; refuse a pack
    over ``limit_bytes`` (saying what did fit). Returns the manifest, also
    written to ``out/MANIFEST.json``.

    Written into a sibling folder and moved to ``out`` once complete: a
    refused or failed pack leaves ``out`` as it was (no empty folder, no
    half pack)."""
    out = Path(out)
    max_per_class = check_max_per_class(max_per_class)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    work = out.with_name(out.name + ".packing")
    if work.exists():
        shutil.rmtree(work)
    try:
        manifest = _pack_into(work, cifar10, weights, wheels, max_per_class, limit_bytes)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if not out.exists():
        work.rename(out)
        return manifest
    _replace_pack(work, out)
    return manifest


def _replace_pack(work: Path, out: Path) -> None:
    """Move the finished pack ``work`` into the existing folder ``out``: the
    files the old manifest lists are removed first (a weights file or wheel
    dropped since is not left behind), nothing else in ``out`` is touched."""
    try:
        old = loads((out / "MANIFEST.json").read_bytes())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        old = {}
    for name in old if isinstance(old, dict) else ():
        f = out / name
        if f.is_file() and f.resolve().is_relative_to(out.resolve()):
            f.unlink()
    for src in sorted(p for p in work.rglob("*") if p.is_file()):
        dst = out / src.relative_to(work)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    shutil.rmtree(work)


def _pack_into(
    out: Path,
    cifar10: str | os.PathLike[str] | None,
    weights: Iterable[str | os.PathLike[str]],
    wheels: Iterable[str | os.PathLike[str]],
    max_per_class: int | None,
    limit_bytes: int,
) -> dict[str, Any]:
    """:func:`pack` into the fresh folder ``out``."""
    out.mkdir(parents=True)
    files: dict[str, Any] = {}
    if cifar10 is not None:
        files["cifar10.npz"] = pack_imagefolder(
            cifar10, out / "cifar10.npz", max_per_class=max_per_class
        )
    for w in weights:
        w = Path(w)
        if not w.is_file():
            raise ConfigError(f"weights file {w} does not exist")
        for src in (w, w.with_name(w.name.removesuffix(".safetensors") + ".card.json")):
            if src.is_file():
                dst = out / "pretrained" / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                files[f"pretrained/{src.name}"] = _file_entry(dst)
    for w in map(Path, wheels):
        if w.suffix != ".whl" or not w.is_file():
            raise ConfigError(f"{w} is not a wheel file")
        dst = out / "wheels" / w.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(w, dst)
        files[f"wheels/{w.name}"] = _file_entry(dst)
    total = sum(f["bytes"] for f in files.values())
    manifest = {"files": files, "total_bytes": total, "limit_bytes": limit_bytes}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if total > limit_bytes:
        sizes = ", ".join(f"{k} {v['bytes'] / 2**20:.1f} MiB" for k, v in files.items())
        raise ConfigError(
            f"the pack is {total / 2**20:.1f} MiB, over the {limit_bytes / 2**20:.0f} MiB a lent "
            f"machine carries ({sizes}); pass --max-per-class to pack a subset of the images"
        )
    return manifest


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The pack's manifest, after checking every file it lists (``None``:
    no pack there)."""
    folder = Path(folder)
    path = folder / "MANIFEST.json"
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MANIFEST_LIMIT:
            raise ValueError("too large")
        # bounded: a deeply nested manifest is a ValueError, not a RecursionError
        manifest = loads(path.read_bytes())
        entries = [
            (str(n), int(e["bytes"]), str(e["sha256"])) for n, e in manifest["files"].items()
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # damaged JSON or shape
        raise DataError(f"{path} is unreadable: re-run `osfl suite pack`") from None
    for name, size, sha in entries:
        f = folder / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise DataError(f"{path} names a file outside the pack ({name[:80]!r})")
        if not f.is_file() or f.stat().st_size != size or sha256_file(f) != sha:
            raise DataError(f"{f} is missing or differs from {path}: re-run `osfl suite pack`")
    return manifest
