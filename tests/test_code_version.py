"""``metrics.json`` says how to make the run again: the whole command line and
the git commit of the code (osfl.code_version; issue "What a researcher
expects, round three", item 3). The CPU model is in ``machine``."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from osfl import code_version as cv
from osfl.cli import main
from osfl.code_version import code_version
from support.tiny import TINY_COMMAND_LINE


def test_the_command_line_and_the_commit_are_recorded(tmp_path: Path) -> None:
    argv = [
        "run",
        "methods=[fedavg]",
        "train.epochs=1",
        *TINY_COMMAND_LINE,
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
        "cache_dir=null",
    ]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert doc["command"] == shlex.join(["osfl", *argv])
    assert doc["code"] == code_version()
    assert doc["machine"]["cpu_kernels"]["cpu"]
    assert (tmp_path / "run" / "config.yaml").read_text().startswith(f"# {doc['command']}\n")


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_the_commit_and_dirt_of_a_checkout_and_none_outside(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cv, "PACKAGE_DIR", tmp_path)
    cv.code_version.cache_clear()
    try:
        assert cv.code_version() is None  # not a git checkout
        _git(tmp_path, "init", "-q")
        (tmp_path / "a.py").write_text("x = 1\n")
        _git(tmp_path, "add", "a.py")
        _git(tmp_path, "commit", "-q", "-m", "one")
        cv.code_version.cache_clear()
        assert cv.code_version() == {"commit": _git(tmp_path, "rev-parse", "HEAD"), "dirty": False}
        (tmp_path / "a.py").write_text("x = 2\n")
        cv.code_version.cache_clear()
        assert cv.code_version()["dirty"] is True
    finally:
        cv.code_version.cache_clear()
