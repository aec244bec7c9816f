"""What a lent GPU machine needs, carried in one ignored folder of the repo
(issue #32): nothing can be downloaded there, and the working tree travels
with at most 64 MiB of ignored paths.

``osfl suite pack`` writes ``gpu_pack/`` (``.gitignore``d):

- ``cifar10.npz``: an image folder (``OSFL_CIFAR10``: ``train/`` and ``test/``,
  one folder per class) as three arrays per split, *the files' own bytes*
  concatenated (``<split>_bytes`` uint8), their offsets (``<split>_offsets``
  int64, N + 1) and relative paths (``<split>_paths``: UTF-8, one a line, as
  uint8; no object arrays, so ``np.load(allow_pickle=False)`` reads it). The images
  are not re-encoded: unpacked, they are the very files the cpu rows decoded,
  so a run gives the same images bit for bit. CIFAR-10 as this repo's
  image folder holds it (60,000 JPEGs of 32 px) is 54.3 MiB: all of it fits;
  as raw uint8 it would be 175.8 MiB (``max_per_class`` packs a subset when
  a larger folder does not fit);
- ``pretrained/``: weights files with their model cards (``NAME.card.json``);
- ``wheels/``: the Python packages osfl imports that the lent machine's image
  lacks (:data:`LENT_MACHINE_LACKS`, at the versions installed here), for
  ``pip install --no-index --target``: its python3 holds torch, numpy,
  safetensors, rich, torchmetrics, scipy, scikit-learn, matplotlib, but not
  these (seen on an H200 lent on 2026-11-25);
- ``MANIFEST.json``: every file's bytes and sha256, the total, the limit.

The suite reads it with :func:`unpack_imagefolder` (the folder written back
under the cache directory once, checked against the manifest's sha256) and
points ``OSFL_CIFAR10`` there, so every config reads it unchanged.
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

from osfl.errors import ConfigError, DataError

#: What a lent machine carries at most (the run tool's limit on ignored paths).
LIMIT_BYTES = 64 * 2**20
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
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm"}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _listing(root: Path, split: str, max_per_class: int | None) -> list[str]:
    """Relative paths of a split's images, sorted (class, then file), at most
    ``max_per_class`` per class (the first in that order)."""
    base = root / split
    if not base.is_dir():
        raise DataError(f"{base} is not a folder: an image folder needs train/ and test/")
    out: list[str] = []
    for cls in sorted(p.name for p in base.iterdir() if p.is_dir()):
        files = sorted(
            p.name for p in (base / cls).iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES
        )
        out += [f"{split}/{cls}/{name}" for name in files[:max_per_class]]
    if not out:
        raise DataError(f"{base} holds no images")
    return out


def pack_imagefolder(root: str | os.PathLike[str], out: str | os.PathLike[str], *,
                     max_per_class: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Pack the image folder ``root`` into the ``.npz`` file ``out`` (the
    files' bytes, unchanged); returns its manifest entry (images per split,
    bytes, sha256)."""
    root, out = Path(root), Path(out)
    arrays: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for split in SPLITS:
        paths = _listing(root, split, max_per_class)
        blobs = [(root / p).read_bytes() for p in paths]
        offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        arrays[f"{split}_bytes"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        arrays[f"{split}_offsets"] = offsets
        if any("\n" in p for p in paths):
            raise DataError(f"{root}: a file name holds a newline; rename it before packing")
        arrays[f"{split}_paths"] = np.frombuffer("\n".join(paths).encode(), dtype=np.uint8)
        counts[split] = len(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, **arrays)  # JPEG bytes do not compress: stored, not deflated
    os.replace(tmp, out)
    return {"images": counts, "max_per_class": max_per_class, **_file_entry(out)}


def _file_entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def unpack_imagefolder(pack: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Write the image folder packed in ``pack`` under ``dest`` (once: a
    ``.packed-sha256`` stamp names the pack it came from) and return ``dest``."""
    pack, dest = Path(pack), Path(dest)
    digest = _sha256(pack)
    stamp = dest / ".packed-sha256"
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".unpacking")
    if tmp.exists():
        shutil.rmtree(tmp)
    with np.load(pack, allow_pickle=False) as z:
        for split in SPLITS:
            data, offsets, paths = (z[f"{split}_{k}"] for k in ("bytes", "offsets", "paths"))
            count = paths.tobytes().count(b"\n") + 1
            if offsets.shape != (count + 1,) or int(offsets[-1]) != data.size:
                raise DataError(f"{pack}: the {split} offsets do not match its bytes")
            names = paths.tobytes().decode().split("\n")
            for i, rel in enumerate(names):
                path = tmp / rel
                if ".." in Path(rel).parts or Path(rel).is_absolute():
                    raise DataError(f"{pack}: refusing the path {rel!r}")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[offsets[i] : offsets[i + 1]].tobytes())
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
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", LENT_PYTHON, "--implementation", "cp", *platforms,
            "-d", str(dest), *pins]  # fmt: skip


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
    written to ``out/MANIFEST.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
    manifest = json.loads(path.read_text())
    for name, entry in manifest["files"].items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != entry["bytes"] or _sha256(f) != entry["sha256"]:
            raise DataError(f"{f} is missing or differs from {path}: re-run `osfl suite pack`")
    return manifest
