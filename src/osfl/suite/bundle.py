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
  largest members are left out first, and ``plan.json`` names them).

Every file is written to a temporary name and moved into place, so a kill
mid-write leaves the previous bundle whole.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from osfl.errors import DataError

#: The bundle's files, all in one folder.
BUNDLE_FILES = ("plan.json", "rows.json", "reproduction_gpu.md", "rates.json", "records.tar.gz")
ARCHIVE = "records.tar.gz"
#: What one returned file may weigh.
FILE_LIMIT = 16 * 2**20
#: The files of a step's directory the archive keeps: records, cards, logs.
KEEP_SUFFIXES = (".json", ".md", ".log", ".yaml", ".txt", ".csv")
#: Larger members (a plot, a long log) are left out before any record.
MEMBER_LIMIT = 4 * 2**20


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


def write_bundle(folder: Path, *, plan: dict[str, Any], rows: list[dict[str, Any]],
                 markdown: str, rates: Mapping[str, Any] | None,
                 members: list[tuple[str, Path]]) -> list[str]:  # fmt: skip
    """Rewrite the bundle in ``folder`` (flat, :data:`BUNDLE_FILES`); returns
    the archive members left out to keep it under :data:`FILE_LIMIT`."""
    folder.mkdir(parents=True, exist_ok=True)
    data, dropped = make_archive(members)
    plan = {**plan, "bundle_left_out": dropped}
    texts = {
        "plan.json": json.dumps(plan, indent=2) + "\n",
        "rows.json": json.dumps(rows, indent=2) + "\n",
        "reproduction_gpu.md": markdown,
        "rates.json": json.dumps(dict(rates or {}), indent=2) + "\n",
    }
    for name, text in texts.items():
        _atomic_bytes(folder / name, text.encode())
    _atomic_bytes(folder / ARCHIVE, data)
    return dropped


def read_json(path: Path, kind: type) -> Any:
    """``path``'s JSON, of type ``kind``; a missing or damaged file is one
    :class:`DataError` line, never a traceback."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
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
