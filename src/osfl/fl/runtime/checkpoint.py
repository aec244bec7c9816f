"""The server's state on disk after every round, so that a killed run goes on
where it stopped and gives the numbers of the run that was never killed.

A :class:`RoundCheckpoints` directory holds

- ``resume.safetensors``: after each finished round, everything the round
  loop needs to continue (the server state through
  :mod:`osfl.fl.state_codec`, the round records, byte counts, phase times,
  the in-process clients' states, the job's digest), written atomically;
- ``pending/round_RRR/client_CCC.safetensors``: every upload of the current
  round as soon as it is accepted (with the client's new state where the
  runtime holds it). A server killed after four of five clients answered
  asks only the fifth again on restart: in a one-shot deployment a client's
  upload can be hours of training.

Restoring the client-sampling generator needs no saved state: it is replayed
from the seed for the finished rounds.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from osfl.errors import DataError
from osfl.fl.state_codec import state_from_bytes, state_to_bytes
from osfl.interrupts import atomic_section
from osfl.safe_read import read_bytes

__all__ = ["PendingUpload", "Resume", "RoundCheckpoints"]

log = logging.getLogger(__name__)

RESUME = "resume.safetensors"
#: The largest checkpoint file read (read through osfl.safe_read: a regular
#: file, so a FIFO left in its place cannot hang a resume).
MAX_BYTES = 1 << 34
_PENDING = re.compile(r"client_(\d+)\.safetensors")


@dataclass
class Resume:
    """What a restarted round loop continues from (rounds ``0..round-1`` done)."""

    job: str
    round: int
    state: Any
    records: list[dict[str, Any]]
    bytes_up: dict[int, dict[int, int]]
    bytes_down: dict[int, dict[int, int]]
    times: dict[str, float]
    client_states: dict[int, bytes] = field(default_factory=dict)


@dataclass
class PendingUpload:
    """An accepted upload of an unfinished round: its bytes, and the client's
    state after it (``None`` where the client keeps its own, e.g. a SuperNode)."""

    upload: bytes
    state: bytes | None = None
    warnings: tuple[str, ...] = ()


def _bytes_tensor(raw: bytes) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.zeros(0, dtype=torch.uint8)
    )


def _atomic_write(path: Path, blob: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with atomic_section():  # Ctrl-C waits for the rename
        tmp.write_bytes(blob)
        os.replace(tmp, path)


class RoundCheckpoints:
    """The checkpoint directory of one job (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # --- finished rounds ---------------------------------------------------
    def save(self, resume: Resume) -> None:
        doc = {
            "job": resume.job,
            "round": resume.round,
            "state": resume.state,
            "records": resume.records,
            "bytes_up": resume.bytes_up,
            "bytes_down": resume.bytes_down,
            "times": resume.times,
            "client_states": {c: _bytes_tensor(b) for c, b in resume.client_states.items()},
        }
        _atomic_write(self.root / RESUME, state_to_bytes(doc))
        self.drop_pending(resume.round - 1)

    def load(self, job: str) -> Resume | None:
        """The saved progress of job ``job`` (``None``: nothing saved yet). A
        checkpoint of another job, or a damaged one, is a DataError: it is never
        silently continued, nor silently thrown away."""
        path = self.root / RESUME
        if not path.is_file():
            return None
        try:
            doc = state_from_bytes(read_bytes(path, max_bytes=MAX_BYTES, what="checkpoint"))
            resume = Resume(
                job=str(doc["job"]),
                round=int(doc["round"]),
                state=doc["state"],
                records=list(doc["records"]),
                bytes_up=_counts(doc["bytes_up"]),
                bytes_down=_counts(doc["bytes_down"]),
                times={str(k): float(v) for k, v in doc["times"].items()},
                client_states={int(c): bytes(t.numpy()) for c, t in doc["client_states"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"{path}: damaged checkpoint ({type(e).__name__}: {e})") from e
        if resume.job != job:
            raise DataError(
                f"{path} was saved by job {resume.job}, this is job {job}: it is another "
                "experiment (config, data, seed or osfl version); resume it with the run that "
                "made it, or start a new run directory"
            )
        return resume

    # --- the unfinished round ------------------------------------------------
    def _pending_dir(self, round: int) -> Path:
        return self.root / "pending" / f"round_{round:03d}"

    def keep(self, round: int, client: int, pending: PendingUpload) -> None:
        meta = {"warnings": list(pending.warnings)}
        tensors = {"upload": _bytes_tensor(pending.upload)}
        if pending.state is not None:
            tensors["state"] = _bytes_tensor(pending.state)
        path = self._pending_dir(round) / f"client_{client:03d}.safetensors"
        _atomic_write(path, state_to_bytes({"tensors": tensors, "meta": meta}))

    def pending(self, round: int) -> dict[int, PendingUpload]:
        """The uploads of ``round`` accepted before the server stopped."""
        where = self._pending_dir(round)
        out: dict[int, PendingUpload] = {}
        if not where.is_dir():
            return out
        for path in sorted(where.iterdir()):
            m = _PENDING.fullmatch(path.name)
            if m is None:
                continue
            try:
                doc = state_from_bytes(read_bytes(path, max_bytes=MAX_BYTES, what="upload"))
                tensors = doc["tensors"]
                state = tensors.get("state")
                out[int(m.group(1))] = PendingUpload(
                    upload=bytes(tensors["upload"].numpy()),
                    state=None if state is None else bytes(state.numpy()),
                    warnings=tuple(str(w) for w in doc["meta"]["warnings"]),
                )
            except (DataError, KeyError, TypeError, AttributeError) as e:  # asked again instead
                path.unlink(missing_ok=True)
                log.warning("%s is damaged (%s); the client is asked again", path, e)
        return out

    def drop_pending(self, round: int) -> None:
        where = self._pending_dir(round)
        if where.is_dir():
            for path in where.iterdir():
                path.unlink(missing_ok=True)
            where.rmdir()


def _counts(x: Any) -> dict[int, dict[int, int]]:
    return {int(r): {int(c): int(n) for c, n in per.items()} for r, per in x.items()}
