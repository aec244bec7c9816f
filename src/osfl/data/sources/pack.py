"""The image pack: an image folder's files in one pickle-free ``.npz``, read
in memory (issue #40).

A lent GPU machine carries at most 64 MiB and decodes its data in the first
minutes of a short job, so the pack is small and is read without writing the
folder back to disk:

- **Small.** Files of one encoder share their first bytes (all 60,000 CIFAR-10
  JPEGs share a 623-byte header: 35.6 of their 52.7 MiB). Each shared prefix
  is stored once (``prefixes`` + ``prefix_offsets``) and every file as a
  prefix id (``<split>_prefix``) and its remainder (``<split>_bytes``,
  ``<split>_offsets``, N + 1). Prefix + remainder is the file bit for bit;
  the ``index`` (JSON as uint8) holds each split's sha256 over the rebuilt
  files, checked when a pack is unpacked or verified. Paths are UTF-8, one a
  line, deflated (``<split>_paths``). No object arrays:
  ``np.load(allow_pickle=False)`` reads it.
- **Checked on read.** The index's ``payload_sha256`` (over every stored
  array) and every offset, length, prefix id and path are validated when a
  pack is opened: a damaged or truncated pack is one
  :class:`~osfl.errors.DataError` line, never a traceback or a wrong image.
- **Read in memory.** ``imagefolder:<file>.npz`` (the image-folder source,
  ``osfl.data.sources.imagefolder``) reads a pack as it reads the folder it
  came from, with the same listing, splits and subsets, decoding from memory
  only the images asked for (``classes``), in a thread pool: the same uint8
  arrays as the unpacked files give.

The first format (issue #32: files whole, paths plain, no index) is still
read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from osfl.data.sources.common import decode_image
from osfl.errors import DataError

#: The layout written by :func:`write_pack` (1: the first, prefix-free one).
FORMAT = 2
SPLITS = ("train", "test")
#: How far two files are compared for a shared prefix (a header, not a photo).
MAX_PREFIX = 1 << 16
#: At most this many shared prefixes (one per encoder setting, in practice).
MAX_PREFIXES = 64
#: A prefix is stored only when it saves more than this many bytes.
MIN_SAVING = 64


# --------------------------------------------------------------------------- writing


def _common_length(ref: np.ndarray, blob: bytes) -> int:
    """The length of the prefix ``blob`` shares with ``ref`` (at most :data:`MAX_PREFIX`)."""
    n = min(len(ref), len(blob), MAX_PREFIX)
    diff = np.flatnonzero(ref[:n] != np.frombuffer(blob, dtype=np.uint8, count=n))
    return int(diff[0]) if diff.size else n


def shared_prefixes(blobs: Sequence[bytes]) -> tuple[list[bytes], np.ndarray]:
    """Prefixes worth storing once, and each blob's prefix id (0: the empty one).

    Greedy: among the files not yet assigned, a few references (first, middle,
    last) are compared with every file; the prefix length that saves the most
    bytes (length × the other files sharing it) is kept for the files sharing
    it, and the rest are tried again. A file whose header differs from all the
    others simply gets the empty prefix, so any folder round-trips.
    """
    ids = np.zeros(len(blobs), dtype=np.int32)
    prefixes: list[bytes] = [b""]
    pool = np.arange(len(blobs))
    while len(prefixes) < MAX_PREFIXES and len(pool) >= 2:
        best: tuple[int, int, int, np.ndarray] | None = None  # saving, length, ref, lengths
        for ref in sorted({int(pool[0]), int(pool[len(pool) // 2]), int(pool[-1])}):
            r = np.frombuffer(blobs[ref], dtype=np.uint8, count=min(len(blobs[ref]), MAX_PREFIX))
            lengths = np.fromiter((_common_length(r, blobs[i]) for i in pool), np.int64, len(pool))
            ranked = np.sort(lengths)[::-1]  # ranked[k]: k + 1 files share that length
            saving = ranked * np.arange(len(ranked))  # stored once instead of k + 1 times
            k = int(np.argmax(saving))
            if best is None or int(saving[k]) > best[0]:
                best = (int(saving[k]), int(ranked[k]), ref, lengths)
        assert best is not None
        saving, length, ref, lengths = best
        if saving <= MIN_SAVING:
            break
        members = lengths >= length
        ids[pool[members]] = len(prefixes)
        prefixes.append(blobs[ref][:length])
        pool = pool[~members]
    return prefixes, ids


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=out[1:])
    return out


def _content_sha256(blobs: Sequence[bytes]) -> str:
    """A split's digest over its files (each with its length, so the cut points count)."""
    h = hashlib.sha256()
    for b in blobs:
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _payload_sha256(arrays: dict[str, np.ndarray]) -> str:
    """Digest over every stored array but the index (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for key in sorted(k for k in arrays if k != "index"):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_pack(
    out: str | os.PathLike[str], files: dict[str, list[tuple[str, bytes]]], *, name: str
) -> dict[str, Any]:
    """Write ``files`` (split -> [(relative path, file bytes)], in order) as the
    pack ``out`` (atomically: a temporary file, then a rename); returns its
    index (format, name, each split's count and sha256)."""
    out = Path(out)
    every = [b for split in SPLITS for _, b in files[split]]
    prefixes, ids = shared_prefixes(every)
    arrays: dict[str, np.ndarray] = {
        "prefixes": np.frombuffer(b"".join(prefixes), dtype=np.uint8),
        "prefix_offsets": _offsets([len(p) for p in prefixes]),
    }
    index: dict[str, Any] = {"format": FORMAT, "name": name, "splits": {}}
    start = 0
    for split in SPLITS:
        paths = [p for p, _ in files[split]]
        if any("\n" in p for p in paths):
            raise DataError(f"{name}: a file name holds a newline; rename it before packing")
        blobs = [b for _, b in files[split]]
        own = ids[start : start + len(blobs)]
        start += len(blobs)
        rest = [b[len(prefixes[i]) :] for b, i in zip(blobs, own.tolist(), strict=True)]
        arrays[f"{split}_prefix"] = own.astype(np.uint8 if len(prefixes) <= 256 else np.int32)
        arrays[f"{split}_offsets"] = _offsets([len(b) for b in rest])
        arrays[f"{split}_bytes"] = np.frombuffer(b"".join(rest), dtype=np.uint8)
        packed_paths = zlib.compress("\n".join(paths).encode(), 9)
        arrays[f"{split}_paths"] = np.frombuffer(packed_paths, dtype=np.uint8)
        index["splits"][split] = {"count": len(blobs), "sha256": _content_sha256(blobs)}
    index["payload_sha256"] = _payload_sha256(arrays)
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, **arrays)  # JPEG bytes do not deflate: stored, not compressed
    os.replace(tmp, out)
    return index


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Split:
    paths: list[str]
    prefix: np.ndarray
    offsets: np.ndarray
    data: np.ndarray


class ImagePack:
    """An opened, validated pack, held in memory: :meth:`blob` rebuilds one
    file's bytes without touching the disk."""

    def __init__(
        self,
        path: Path,
        name: str,
        prefixes: list[bytes],
        splits: dict[str, _Split],
        digests: dict[str, str],
        digest: str,
    ) -> None:
        self.path = path
        self.name = name
        self.prefixes = prefixes
        self.splits = splits
        self.digests = digests  # split -> sha256 over its rebuilt files ("" in format 1)
        self.digest = digest  # identifies the content (the decoded-data cache's key)

    def __len__(self) -> int:
        return sum(len(s.paths) for s in self.splits.values())

    def paths(self) -> list[str]:
        """Every file's relative path (``<split>/<class>/<file>``), split by split."""
        return [p for s in SPLITS for p in self.splits[s].paths]

    def blob(self, split: str, i: int) -> bytes:
        """The ``i``-th file of ``split``, bit for bit."""
        s = self.splits[split]
        rest = s.data[int(s.offsets[i]) : int(s.offsets[i + 1])].tobytes()
        return self.prefixes[int(s.prefix[i])] + rest

    def files(self) -> dict[str, bytes]:
        """Relative path -> bytes, for every file (what :meth:`verify` hashes)."""
        return {
            s.paths[i]: self.blob(k, i) for k, s in self.splits.items() for i in range(len(s.paths))
        }

    def verify(self) -> None:
        """Check the rebuilt files against the digests the packer wrote."""
        for split, s in self.splits.items():
            want = self.digests.get(split)
            if want and _content_sha256([self.blob(split, i) for i in range(len(s.paths))]) != want:
                raise DataError(f"{self.path}: the {split} files do not rebuild to what was packed")


def is_pack_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a pack file (``*.npz``) rather than an image folder."""
    p = Path(path).expanduser()
    return p.suffix == ".npz" and p.is_file()


def _fail(path: Path, what: str) -> DataError:
    return DataError(f"{path}: {what}; the pack is damaged: re-run `osfl suite pack`")


def _array(arrays: dict[str, np.ndarray], key: str, path: Path, kind: str) -> np.ndarray:
    a = arrays.get(key)
    if a is None or a.ndim != 1 or a.dtype.kind not in kind:
        raise _fail(path, f"its array {key!r} is missing or of the wrong type")
    return a


def _check_offsets(offsets: np.ndarray, count: int, size: int, what: str, path: Path) -> None:
    if (
        offsets.shape != (count + 1,)
        or (count >= 0 and int(offsets[0]) != 0)
        or bool(np.any(np.diff(offsets) < 0))
        or int(offsets[-1]) != size
    ):
        raise _fail(path, f"the {what} offsets do not match its {count} files and {size} bytes")


def _check_paths(paths: list[str], split: str, path: Path) -> None:
    """Every path is ``<split>/<class>/<file>``: nothing written or read outside."""
    for rel in paths:
        parts = rel.split("/")
        if (
            len(parts) != 3
            or parts[0] != split
            or parts[1] in ("", ".", "..")
            or parts[2] in ("", ".", "..")
            or "\\" in rel
            or "\0" in rel
        ):
            raise _fail(path, f"the {split} path {rel[:80]!r} is not {split}/<class>/<file>")


def open_pack(path: str | os.PathLike[str]) -> ImagePack:
    """Read and validate the pack ``path`` (every array, offset, prefix id and
    path, and the stored sha256): a damaged pack is one DataError line."""
    path = Path(path).expanduser()
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy: an array, no archive
            raise ValueError("not an .npz archive")
        with z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        if isinstance(e, FileNotFoundError):
            raise DataError(f"{path}: no such pack; run `osfl suite pack`") from None
        raise _fail(path, f"it cannot be read ({type(e).__name__}: {str(e)[:120]})") from None
    if "index" not in arrays:
        return _open_format1(path, arrays)
    try:
        index = json.loads(_array(arrays, "index", path, "u").tobytes().decode())
        digests = {s: str(index["splits"][s]["sha256"]) for s in SPLITS}
        counts = {s: int(index["splits"][s]["count"]) for s in SPLITS}
        fmt, name, payload = index["format"], str(index["name"]), str(index["payload_sha256"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise _fail(path, "its index is unreadable") from None
    if fmt != FORMAT:
        raise DataError(f"{path}: pack format {fmt!r}, this osfl reads {FORMAT}: re-run the packer")
    if _payload_sha256(arrays) != payload:
        raise _fail(path, "its sha256 differs from the one it was written with")
    pdata = _array(arrays, "prefixes", path, "u")
    poffs = _array(arrays, "prefix_offsets", path, "iu")
    _check_offsets(poffs, len(poffs) - 1, pdata.size, "prefix", path)
    prefixes = [pdata[poffs[i] : poffs[i + 1]].tobytes() for i in range(len(poffs) - 1)]
    splits: dict[str, _Split] = {}
    for split in SPLITS:
        data = _array(arrays, f"{split}_bytes", path, "u")
        offsets = _array(arrays, f"{split}_offsets", path, "iu")
        prefix = _array(arrays, f"{split}_prefix", path, "iu")
        try:
            text = zlib.decompress(_array(arrays, f"{split}_paths", path, "u").tobytes()).decode()
        except (zlib.error, UnicodeDecodeError):
            raise _fail(path, f"its {split} paths are unreadable") from None
        splits[split] = _split(path, split, text, counts[split], prefix, offsets, data, prefixes)
    return ImagePack(path, name, prefixes, splits, digests, payload)


def _split(
    path: Path,
    split: str,
    text: str,
    count: int,
    prefix: np.ndarray,
    offsets: np.ndarray,
    data: np.ndarray,
    prefixes: list[bytes],
) -> _Split:
    """One split's arrays, checked against each other and the index's count."""
    paths = text.split("\n") if text else []
    if len(paths) != count or prefix.shape != (count,):
        raise _fail(path, f"its {split} split lists {len(paths)} paths for {count} files")
    _check_offsets(offsets, count, data.size, split, path)
    if count and (int(prefix.min()) < 0 or int(prefix.max()) >= len(prefixes)):
        raise _fail(path, f"a {split} file names a prefix the pack does not hold")
    _check_paths(paths, split, path)
    return _Split(paths, prefix, offsets, data)


def _open_format1(path: Path, arrays: dict[str, np.ndarray]) -> ImagePack:
    """The first layout (issue #32): whole files, plain paths, no index."""
    h = hashlib.sha256(b"format1")
    splits: dict[str, _Split] = {}
    for split in SPLITS:
        data = _array(arrays, f"{split}_bytes", path, "u")
        offsets = _array(arrays, f"{split}_offsets", path, "iu")
        try:
            text = _array(arrays, f"{split}_paths", path, "u").tobytes().decode()
        except UnicodeDecodeError:
            raise _fail(path, f"its {split} paths are unreadable") from None
        count = text.count("\n") + 1 if text else 0
        zeros = np.zeros(count, dtype=np.uint8)
        splits[split] = _split(path, split, text, count, zeros, offsets, data, [b""])
        for a in (data, offsets, arrays[f"{split}_paths"]):
            h.update(np.ascontiguousarray(a).tobytes())
    return ImagePack(path, path.stem, [b""], splits, {}, h.hexdigest())


# --------------------------------------------------------------------------- decoding


def decode_blob(
    data: bytes, name: str, mode: str, size: int | None, expect: tuple[int, int] | None
) -> np.ndarray:
    """One image file's bytes -> H×W×C uint8, by the very steps of
    :func:`osfl.data.sources.common.decode_file` (JPEG ``draft`` before a
    resize, ``convert``, antialiased bilinear ``resize``), so a file gives
    the same array whether it is read from the disk or from a pack."""
    return decode_image(io.BytesIO(data), name, mode, size, expect)


#: ``decode(relative path, mode, size, expect) -> H×W×C uint8`` (a file or a pack's)
Decoder = Callable[[str, str, int | None, tuple[int, int] | None], np.ndarray]


def pack_decoder(pack: ImagePack) -> Decoder:
    """``decode(rel, mode, size, expect)`` for the pack's files (by relative path)."""
    where = {p: (s, i) for s, sp in pack.splits.items() for i, p in enumerate(sp.paths)}

    def decode(rel: str, mode: str, size: int | None, expect: tuple[int, int] | None) -> np.ndarray:
        split, i = where[rel]
        return decode_blob(pack.blob(split, i), f"{pack.path}:{rel}", mode, size, expect)

    return decode


RESIZE_MODES = ("auto", "pillow", "torch")


def resize_device(resize: str) -> torch.device | None:
    """Where images are upsampled: ``None`` for Pillow on the CPU (the default
    on a CPU machine, bit for bit today's path), else the torch device.

    ``auto``: torch on the GPU when CUDA is available (a 32 → 224 px upsample
    of 50,000 images costs minutes in Pillow on a few cores), Pillow
    otherwise; ``torch``: torch's antialiased bilinear on the GPU if there is
    one, else on the CPU; ``pillow``: always Pillow."""
    if resize not in RESIZE_MODES:
        raise DataError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
    cuda = torch.cuda.is_available()
    if resize == "pillow" or (resize == "auto" and not cuda):
        return None
    return torch.device("cuda" if cuda else "cpu")


def upsample(
    images: torch.Tensor, size: int, device: torch.device, chunk: int = 512
) -> torch.Tensor:
    """uint8 N×C×h×w -> N×C×size×size (uint8, on the CPU), resized on ``device``
    by the op of :func:`osfl.data.sources.common.resize_images` (bilinear,
    antialiased, rounded; the same values on the CPU): within one grey level
    of Pillow's (docs/gpu-suite.md). ``chunk`` images at a time bound the
    device memory (512 at 448 px: 1.2 GB of float32)."""
    if tuple(images.shape[-2:]) == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for s in range(0, images.shape[0], chunk):
        x = images[s : s + chunk].to(device).float()
        r = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[s : s + chunk] = r.round_().clamp_(0, 255).to(torch.uint8).cpu()
    return out
