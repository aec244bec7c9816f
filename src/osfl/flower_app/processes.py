"""The processes and ports a local Flower federation is made of: free
loopback ports and waiting for them, a process tree found through Linux's
``/proc`` (Flower's ``flower-superexec`` and ``flwr-serverapp`` /
``flwr-clientapp`` children, which :class:`~osfl.flower_app.local.LocalFederation`
must end too), signals, Flower's console scripts and what they print (colour
codes, a JSON document after status lines). Shared with
:mod:`osfl.flower_app.runs`, which reads ``flwr``'s output too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, OsflError

HOST = "127.0.0.1"
#: The colour codes Flower's logger writes whatever its output is (Flower 1.41).
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """``text`` without Flower's colour codes."""
    return ANSI.sub("", text)


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    """Block until something accepts connections on ``port`` (or fail with its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OsflError(
                f"process exited with {proc.returncode}; see {log_file}:\n{log_tail(log_file)}"
            )
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise OsflError(f"nothing listens on {HOST}:{port} after {timeout:.0f} s; see {log_file}")


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(plain(path.read_text(errors="replace")).splitlines()[-lines:])
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, children first."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def send_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():  # a zombie is dead for our purposes
        with contextlib.suppress(OSError, IndexError):
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def json_tail(out: str) -> dict[str, Any]:
    """The JSON document a ``flwr ... --format json`` command printed (after
    any status lines)."""
    start = out.find("{") if out.lstrip().startswith("{") else out.find("\n{") + 1
    try:
        doc = json.loads(out[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise OsflError(f"flwr printed no JSON document:\n{out[-2000:]}")
    return doc


def flower_bin(name: str) -> str:
    """A Flower console script next to this Python (or on PATH)."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise ConfigError(
            f"{name} not found: install Flower (pip install flwr) in this environment"
        )
    return found
