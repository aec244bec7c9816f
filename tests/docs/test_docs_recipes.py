"""The one-machine Flower recipes run as written (slow: real SuperLink and
SuperNode processes, several minutes): the README's and docs/flower.md's
loopback rehearsal, docs/flower-security.md's TLS rehearsal, and the script
``osfl flower certs`` prints. Each runs in a fresh directory, in its own
process session that is killed afterwards; its fixed ports must be free."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.paths import ROOT

PORTS = (9093, 9100, 9101, 9102)


def bash_block(path: Path, heading: str) -> str:
    """The first ```bash block after the line that starts with ``heading``."""
    text = path.read_text()
    after = text[text.index(heading) :]
    found = re.search(r"^```bash\n(.*?)^```", after, re.S | re.M)
    assert found, f"no bash block after {heading!r} in {path.name}"
    return found.group(1)


def _busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run_recipe(script: str, cwd: Path, timeout: float = 900) -> str:
    """Run ``script`` with bash in ``cwd`` (osfl from this checkout) and return
    its output; every process it left running is stopped afterwards."""
    busy = [p for p in PORTS if _busy(p)]
    if busy:
        pytest.skip(f"ports in use: {busy}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    log = cwd / "recipe.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        finally:
            _stop_session(proc.pid)
    text = log.read_text(errors="replace")
    assert code == 0, f"{text[:3000]}\n...\n{text[-3000:]}"
    return text


def _stop_session(sid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(sid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(sid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def _summaries(cwd: Path) -> list[str]:
    return [p.read_text() for p in sorted(cwd.glob("runs/*/summary.md"))]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("doc", "heading", "runs"),
    [
        ("README.md", "As real processes on one machine", 2),
        ("docs/flower.md", "## A rehearsal on one machine", 2),
        ("docs/flower-security.md", "## A TLS rehearsal on one machine", 1),
    ],
)
def test_a_one_machine_recipe_runs_as_written(tmp_path: Path, doc: str, heading: str, runs: int):
    run_recipe(bash_block(ROOT / doc, heading), tmp_path)
    found = _summaries(tmp_path)
    assert len(found) == runs and all("| fedavg |" in s or "| ensemble |" in s for s in found)


@pytest.mark.slow
def test_the_commands_osfl_flower_certs_prints_run_as_printed(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "osfl.cli", "flower", "certs", "tls", "--node-keys", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    printed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    script = printed.stdout[printed.stdout.index("# The commands below") :]
    run_recipe(script, tmp_path)
    (summary,) = _summaries(tmp_path)
    assert "| fedavg |" in summary
