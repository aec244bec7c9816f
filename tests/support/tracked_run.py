"""A tiny ``osfl run`` (FedAvg for 3 rounds, evaluated every round, and
``local``) with one experiment tracker, and its records: what every tracker
test compares its backend's files with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from osfl.cli import main
from support.smoke import tiny_cli_args


def run_with_logger(tmp: Path, logger: str, *mode: str) -> Path:
    """The run directory (``tmp/run``); ``mode`` e.g. ``--resume DIR``."""
    out = tmp / "run"
    args = ["eval_every=1", "method.fedavg.rounds=3", f"logger=[{logger}]"]
    assert main(["run", *tiny_cli_args(tmp, "fedavg,local"), *args, "--out", str(out), *mode]) == 0
    return out


def records_by_method(out: Path) -> dict[str, dict[str, Any]]:
    records = json.loads((out / "metrics.json").read_text())["records"]
    return {r["method"]: r for r in records}


def resume_without_local(tmp: Path, logger: str, out: Path) -> None:
    """Drop the ``local`` record from ``metrics.json`` and resume the run:
    the resume runs ``local`` again, and only it."""
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["method"] != "local"]
    (out / "metrics.json").write_text(json.dumps(doc))
    args = ["eval_every=1", "method.fedavg.rounds=3", f"logger=[{logger}]"]
    assert main(["run", *tiny_cli_args(tmp, "fedavg,local"), *args, "--resume", str(out)]) == 0
