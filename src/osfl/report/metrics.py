"""``metrics.json``: written atomically after every finished record, read back
as typed, validated :class:`~osfl.record.RunRecord` objects.

The document is ``{"schema_version", "osfl_version", "created", "machine",
..info, "records"}``; the records' schema and its versions are
:mod:`osfl.record` (and ``docs/run-directory.md``).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from osfl import __version__, jsonio
from osfl.errors import DataError
from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id
from osfl.interrupts import atomic_section
from osfl.record import SCHEMA_VERSION, RecordError, as_json, file_version, read_records
from osfl.safe_read import read_json

__all__ = ["SCHEMA_VERSION", "machine_info", "read_metrics", "write_metrics"]

#: The largest ``metrics.json`` read (a record is a few KiB; a 1,000-round
#: run's curves a few MiB).
MAX_METRICS_BYTES = 256 << 20


def write_metrics(
    path: str | Path, records: Sequence[Mapping[str, Any]], *, info: Mapping[str, Any]
) -> Path:
    """``metrics.json``: ``{"schema_version", "osfl_version", "created", ..info, "records"}``,
    written atomically (runs rewrite it after every finished record)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "osfl_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **dict(info),
        "records": [as_json(r) for r in records],
    }
    p = Path(path)
    text = jsonio.dumps(doc, indent=2) + "\n"
    tmp = p.with_name(f".{p.name}.tmp")
    with atomic_section():  # Ctrl-C waits for the rename: never half a metrics.json
        tmp.write_text(text)
        os.replace(tmp, p)  # atomic: a reader (or a crash) never sees half a file
    return p


def machine_info() -> dict[str, Any]:
    """What a CPU result depends on besides the code and the seed: the CPU
    kernel fingerprint (:mod:`osfl.fl.fingerprint`: torch's build and
    capability, oneDNN's ISA, the pinning variables, the CPU's flags and
    caches) and torch's thread count, plus the GPU, Python and platform."""
    kernels = cpu_fingerprint()
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_fingerprint": fingerprint_id(kernels),
        "cpu_kernels": kernels,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def read_metrics(path: str | Path) -> dict[str, Any]:
    """A run's ``metrics.json`` with its ``records`` as typed
    :class:`~osfl.record.RunRecord` objects, migrated from the file's
    ``schema_version`` to the current one (:func:`osfl.record.migrate`); the
    document's ``schema_version`` is then the current one. Anything that is
    not a readable run record (a field of the wrong type, no ``method`` or
    ``seed``, a version this code cannot read) is one :class:`DataError`
    naming the file, the record and the field; the text is read with bounded
    nesting (:func:`osfl.jsonio.loads`)."""
    # a regular UTF-8 file of bounded size (a FIFO or /dev/zero is one line)
    doc = read_json(path, max_bytes=MAX_METRICS_BYTES, what="metrics file")
    records = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(records, list):
        raise DataError(f"{path}: damaged (no list of records)")
    try:
        typed = read_records(records, file_version(doc))
    except RecordError as e:
        raise RecordError(f"{path}: damaged ({e})", e.field) from e
    return {**doc, "schema_version": SCHEMA_VERSION, "records": typed}
