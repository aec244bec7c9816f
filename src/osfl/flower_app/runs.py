"""Whether a Flower run of osfl worked, as an exit status scripts and CI can read.

``flwr run`` exits 0 when the SuperLink accepted the run, whatever the
ServerApp then did (Flower 1.41: a ServerApp that raised is only a
``finished:failed`` status in ``flwr ls``). Two commands close that gap:

- ``osfl flower run APP SUPERLINK [flwr run options]``: ``flwr run ...
  --stream``, its output passed through, then ``flwr ls --run-id`` for the
  run's final status: exit 0 when it finished ``completed``, 1 when it failed
  (one ``osfl: error:`` line with Flower's details), 2 when it could not start;
- ``osfl flower status RUN_DIR``: the run directory the ServerApp wrote (for a
  server on another host): exit 0 when it holds a finished record, 1 when the
  run failed or did not finish (its ``run_failed`` reason), 2 when it is no
  osfl run directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from osfl import jsonio
from osfl.errors import ConfigError, DataError, OsflError
from osfl.flower_app.local import flower_bin, json_tail, plain
from osfl.safe_read import read_json, read_text

_STARTED = re.compile(r"Successfully started run (\d+)")


class RunFailed(OsflError):
    """The Flower run started and then failed (exit status 1, not 2)."""

    exit_status = 1


def started_run_id(output: str) -> int | None:
    """The run id ``flwr run`` printed, if it started one."""
    found = _STARTED.search(plain(output))
    return int(found.group(1)) if found else None


def run_status(superlink: str, run_id: int) -> dict[str, Any]:
    """The run's row of ``flwr ls SUPERLINK --run-id ID --format json``."""
    cmd = [flower_bin("flwr"), "ls", superlink, "--run-id", str(run_id), "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    doc = json_tail(plain(done.stdout))
    runs = doc.get("runs")
    if done.returncode != 0 or not isinstance(runs, list) or not runs:
        raise ConfigError(f"flwr ls found no run {run_id} on {superlink}: {doc}")
    return dict(runs[0])


def check_status(row: dict[str, Any], run_id: int) -> None:
    """Raise :class:`RunFailed` unless the run finished completed."""
    status = str(row.get("status", ""))
    if status.endswith(":completed"):
        return
    details = str(row.get("status-details") or "no details").strip().splitlines()
    raise RunFailed(f"Flower run {run_id} ended {status or 'unknown'}: {details[-1]}")


def flower_run(app: str, superlink: str, flwr_args: list[str]) -> int:
    """``flwr run APP SUPERLINK ... --stream``, then the run's final status."""
    cmd = [flower_bin("flwr"), "run", app, superlink, *flwr_args, "--stream"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    terminal = sys.stdout.isatty()
    for line in proc.stdout:
        sys.stdout.write(line if terminal else plain(line))  # a file gets no colour codes
        seen.append(line)
    proc.wait()
    run_id = started_run_id("".join(seen))
    if run_id is None:
        raise ConfigError(f"flwr run started no run (exit status {proc.returncode})")
    check_status(run_status(superlink, run_id), run_id)
    print(f"osfl: Flower run {run_id} completed")
    return 0


def run_dir_status(run_dir: str | Path) -> int:
    """Exit 0 when ``run_dir`` holds a finished run; :class:`RunFailed` when
    it failed or stopped; :class:`DataError` when it is no osfl run directory.

    A resumed run appends to the same ``events.jsonl``, so only the last
    attempt counts (from its ``run_start`` on): an earlier attempt that
    failed, then ``--resume`` to the end, is a finished run. Finished also
    means a record: ``metrics.json`` with at least one."""
    root = Path(run_dir)
    events = _last_attempt(root)
    kinds = {str(e.get("event")): e for e in events}
    if "run_failed" in kinds:
        e = kinds["run_failed"]
        raise RunFailed(f"{root}: the run failed: {e.get('error')}: {e.get('reason')}")
    if "run_end" not in kinds:
        raise RunFailed(f"{root}: the run did not finish (no run_end event)")
    records = _record_count(root)
    if not records:
        raise RunFailed(f"{root}: the run ended but left no record (metrics.json has none)")
    print(f"{root}: finished ({records} record{'s' if records != 1 else ''})")
    return 0


#: The largest ``events.jsonl`` read (a round's event is about 1 KiB).
MAX_EVENTS_BYTES = 512 << 20


def _last_attempt(root: Path) -> list[dict[str, Any]]:
    """The events of the run directory's last attempt (its last
    ``run_start`` and after); a damaged log is one :class:`DataError`."""
    events = root / "events.jsonl"
    if not events.exists() and not events.is_symlink():  # a FIFO or a device: refused below
        raise DataError(f"{root} is not an osfl run directory (no events.jsonl)")
    # a regular UTF-8 file of bounded size: a FIFO or /dev/zero is one line
    text = read_text(events, max_bytes=MAX_EVENTS_BYTES, what="event log")
    parsed = []
    for line in text.splitlines():
        try:
            event = jsonio.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        if isinstance(event, dict):
            parsed.append(event)
    starts = [i for i, e in enumerate(parsed) if e.get("event") == "run_start"]
    if not starts:
        raise DataError(f"{events}: no run_start event: not an osfl run's log")
    return parsed[starts[-1] :]


def _record_count(root: Path) -> int:
    """How many records ``metrics.json`` holds (0 when it is missing or damaged)."""
    try:  # bounded, regular files only: a FIFO would hang the status
        doc = read_json(root / "metrics.json", max_bytes=MAX_EVENTS_BYTES, what="metrics file")
    except DataError:
        return 0
    records = doc.get("records") if isinstance(doc, dict) else None
    return len(records) if isinstance(records, list) else 0
