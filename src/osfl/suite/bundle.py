"""The bundle: what a job hands back (issue #40).

A lent machine returns at most 8 files of at most 16 MiB each, at most two
folders deep, and may be taken back mid-step. So after every finished step
the suite rewrites one flat folder (:data:`BUNDLE_FILES`):

- ``plan.json``: every step's estimate, status, seconds and output hashes;
- ``rows.json``: the finished steps' rows (what ``osfl suite import`` reads);
- ``reproduction_gpu.md``: the same rows as REPRODUCTION text;
- ``rates.json``: the measured rates the plan priced work with;
- ``records.tar.gz``: each finished step's records, model cards, configs and
  logs (never weights) and the suite's own log, capped at 16 MiB (the
  largest members are left out first, and ``plan.json`` names them);
- the files a finished step ``returns`` as they are (the encoder's bf16
  weights and card: :mod:`osfl.suite.encoder`), each at most 16 MiB, while
  the folder stays within :data:`MAX_FILES` with the job script's
  ``job.log``.

Every file is written to a temporary name and moved into place, so a kill
mid-write leaves the previous bundle whole.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.jsonio import loads

#: The bundle's files, all in one folder.
BUNDLE_FILES = ("plan.json", "rows.json", "reproduction_gpu.md", "rates.json", "records.tar.gz")
ARCHIVE = "records.tar.gz"
#: What one returned file may weigh.
FILE_LIMIT = 16 * 2**20
#: The files of a step's directory the archive keeps: records, cards, logs.
KEEP_SUFFIXES = (".json", ".md", ".log", ".yaml", ".txt", ".csv")
#: Larger members (a plot, a long log) are left out before any record.
MEMBER_LIMIT = 4 * 2**20
#: What a lent machine returns at most, ``job.log`` (the script's) included.
MAX_FILES = 8
#: The largest JSON file the suite reads (its own plan and rows are far smaller).
JSON_LIMIT = 64 * 2**20


def _atomic_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def archive_members(dirs: Mapping[str, Path], extra: Iterable[Path] = ()) -> list[tuple[str, Path]]:
    """(name in the archive, file) of every record, card and log under the
    step directories ``dirs`` (step name -> directory), then ``extra``."""
    out: list[tuple[str, Path]] = []
    for name, root in dirs.items():
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in KEEP_SUFFIXES and f.stat().st_size <= MEMBER_LIMIT:
                out.append((f"{name}/{f.relative_to(root)}", f))
    out += [(f.name, f) for f in extra if f.is_file()]
    return out


def make_archive(
    members: list[tuple[str, Path]], limit: int = FILE_LIMIT
) -> tuple[bytes, list[str]]:
    """A tar.gz of ``members`` no larger than ``limit``: the largest members
    are left out until it fits; returns the bytes and what was left out."""
    kept = list(members)
    dropped: list[str] = []
    while True:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for arcname, path in kept:
                tar.add(path, arcname=arcname, recursive=False)
        data = buf.getvalue()
        if len(data) <= limit or not kept:
            return data, dropped
        biggest = max(kept, key=lambda m: m[1].stat().st_size)
        kept.remove(biggest)
        dropped.append(biggest[0])


def returned_files(files: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """The files of ``files`` a bundle can return as they are (each at most
    :data:`FILE_LIMIT`, distinct names, :data:`MAX_FILES` in all with
    :data:`BUNDLE_FILES` and ``job.log``), and why the others are not."""
    room = MAX_FILES - len(BUNDLE_FILES) - 1
    kept: list[Path] = []
    left: list[str] = []
    for f in files:
        if not f.is_file():
            left.append(f"{f.name} (missing)")
        elif f.stat().st_size > FILE_LIMIT:
            left.append(f"{f.name} ({f.stat().st_size / 2**20:.1f} MiB, over 16)")
        elif len(kept) >= room or f.name in BUNDLE_FILES or f.name in {k.name for k in kept}:
            left.append(f"{f.name} (no room in the bundle)")
        else:
            kept.append(f)
    return kept, left


def write_bundle(
    folder: Path,
    *,
    plan: dict[str, Any],
    rows: list[dict[str, Any]],
    markdown: str,
    rates: Mapping[str, Any] | None,
    members: list[tuple[str, Path]],
    files: Sequence[Path] = (),
) -> list[str]:
    """Rewrite the bundle in ``folder`` (flat, :data:`BUNDLE_FILES` and the
    ``files`` steps return); returns the archive members left out to keep
    it under :data:`FILE_LIMIT`."""
    folder.mkdir(parents=True, exist_ok=True)
    data, dropped = make_archive(members)
    kept, left = returned_files(files)
    plan = {**plan, "bundle_left_out": dropped + left}
    texts = {
        "plan.json": json.dumps(plan, indent=2) + "\n",
        "rows.json": json.dumps(rows, indent=2) + "\n",
        "reproduction_gpu.md": markdown,
        "rates.json": json.dumps(dict(rates or {}), indent=2) + "\n",
    }
    for name, text in texts.items():
        _atomic_bytes(folder / name, text.encode())
    _atomic_bytes(folder / ARCHIVE, data)
    for f in kept:
        tmp = folder / (f.name + ".tmp")
        shutil.copyfile(f, tmp)
        os.replace(tmp, folder / f.name)
    return dropped


def read_json(path: Path, kind: type) -> Any:
    """``path``'s JSON, of type ``kind``; a missing, special, oversized, not
    UTF-8, too deeply nested or otherwise damaged file is one
    :class:`DataError` line, never a traceback (:func:`osfl.jsonio.loads`'
    bounds: no ``RecursionError``)."""
    if not path.exists():
        raise DataError(f"{path} is missing")
    if not path.is_file():
        raise DataError(f"{path} is not a regular file")
    if path.stat().st_size > JSON_LIMIT:
        raise DataError(f"{path} is larger than {JSON_LIMIT // 2**20} MiB: not the suite's")
    try:
        doc = loads(path.read_bytes())
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError, JSONBoundError
        raise DataError(f"{path} is damaged ({e})") from None
    if not isinstance(doc, kind):
        raise DataError(f"{path} is damaged (a JSON {kind.__name__} expected)")
    return doc


def read_bundle(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The bundle's plan and rows, checked enough to import them."""
    if not folder.is_dir():
        raise DataError(f"{folder} is not a bundle folder")
    plan = read_json(folder / "plan.json", dict)
    rows = read_json(folder / "rows.json", list)
    need = ("section", "step", "method", "setting", "per_seed", "scale", "command")
    for i, r in enumerate(rows):
        missing = [k for k in need if not isinstance(r, dict) or k not in r]
        if missing:
            raise DataError(f"{folder / 'rows.json'}: row {i} lacks {', '.join(missing)}")
    return plan, rows
