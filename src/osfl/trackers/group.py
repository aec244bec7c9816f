"""The trackers of one run, driven as one: the run calls a :class:`TrackerGroup`
and never a backend.

:func:`check_installed` runs before anything is planned, so that a missing
optional package is one line naming its ``pip install`` and not a traceback
after the clients have trained. The group keeps each backend's run id in
``RUN_DIR/trackers.json``, so that ``osfl run --resume`` continues the same
W&B / MLflow run; a resume hands the backends only the records it finishes
(the earlier ones were logged by the process that finished them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from osfl.errors import ConfigError
from osfl.interrupts import atomic_section
from osfl.record import RunRecord
from osfl.safe_read import read_json
from osfl.trackers.base import TRACKERS, RunInfo, SummaryTable, Tracker

#: The file in the run directory that holds each backend's run id.
IDS_FILE = "trackers.json"


def missing_extras(names: Sequence[str]) -> list[str]:
    """The osfl extras of the named backends whose package is not installed."""
    missing = []
    for name in names:
        cls = TRACKERS.get(name)
        if importlib.util.find_spec(cls.package) is None and cls.extra not in missing:
            missing.append(cls.extra)
    return missing


def check_installed(names: Sequence[str]) -> None:
    """A :class:`ConfigError` naming the ``pip install`` of every named backend
    whose package is missing (one line for all of them)."""
    missing = missing_extras(names)
    if missing:
        what, one = ", ".join(missing), len(missing) == 1
        raise ConfigError(
            f"logger: {what} {'is' if one else 'are'} not installed: "
            f'pip install "osfl[{",".join(missing)}]" (or drop {"it" if one else "them"} from logger)'
        )


#: The largest ``trackers.json`` read: a few ids of a few dozen characters each.
MAX_IDS_BYTES = 64 << 10


def read_ids(path: Path) -> dict[str, str]:
    """The backends' run ids a run directory holds (none when it has no
    file: a new backend run is opened). A file that is not a JSON object of
    short strings (damaged, nested, a FIFO, not UTF-8) is one line: a
    resume must not open a second tracker run in silence."""
    if not path.exists() and not path.is_symlink():
        return {}
    fix = f"delete {path} to open new tracker runs"
    try:
        ids = read_json(
            path, max_bytes=MAX_IDS_BYTES, max_depth=1, what="tracker ids file", error=ConfigError
        )
    except ConfigError as e:
        raise ConfigError(f"{e}; {fix}") from None
    if not isinstance(ids, Mapping) or not all(
        isinstance(v, str) and 0 < len(v) <= 256 for v in ids.values()
    ):
        raise ConfigError(
            f"tracker ids file {path} is damaged (not an object of run-id strings); {fix}"
        )
    return {str(k): v for k, v in ids.items()}


def _start(name: str, tracker: Tracker, info: RunInfo) -> str | None:
    """``tracker.start(info)``; a backend that cannot start (not logged in, its
    server unreachable, its store refused) is one line, before any client trains."""
    try:
        return tracker.start(info)
    except Exception as e:  # a third-party package's own errors: no common type
        raise ConfigError(f"logger: {name} did not start: {type(e).__name__}: {e}") from e


class TrackerGroup:
    """The backends ``logger`` names, in its order, called one after another.

    Use as a context manager around the run: leaving it closes every backend
    (``failed`` when an exception stops the run) unless :meth:`finish` did."""

    def __init__(self, names: Sequence[str]) -> None:
        check_installed(names)
        self.trackers: dict[str, Tracker] = {n.lower(): TRACKERS.get(n)() for n in names}
        self._ended = False

    def start(self, info: RunInfo, *, resumed: bool) -> None:
        """Start every backend; on a resume each gets the id it gave before."""
        if not self.trackers:
            return
        path = info.run_dir / IDS_FILE
        before = read_ids(path) if resumed else {}
        ids = dict(before)
        for name, tracker in self.trackers.items():
            new = _start(name, tracker, dataclasses.replace(info, resume_id=before.get(name)))
            if new is not None:
                ids[name] = new
        if ids:
            with atomic_section():  # a second Ctrl-C waits for the whole file
                path.write_text(json.dumps(ids, indent=2) + "\n", encoding="utf-8")

    def log_round(
        self, method: str, seed: int, point: str, round: int, metrics: Mapping[str, float]
    ) -> None:
        for tracker in self.trackers.values():
            tracker.log_round(method, seed, point, round, metrics)

    def log_record(self, record: RunRecord) -> None:
        for tracker in self.trackers.values():
            tracker.log_record(record)

    def finish(self, summary: SummaryTable) -> None:
        for tracker in self.trackers.values():
            tracker.finish(summary)
        self._ended = True

    def __enter__(self) -> TrackerGroup:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for tracker in self.trackers.values():
            tracker.close(failed=kind is not None and not self._ended)
