"""The one command of a lent-GPU job, ``scripts/gpu_job.sh`` (issue #40), in
a CPU dry run: the very script a job runs (install what is carried, measure,
plan, run under the inner timeout, write the bundle into ``$OUT``), on the
catalogue's tiny MFU step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu_job.sh"

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


def _job(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OSFL_CIFAR10", "PYTHONPATH")}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path / "OUT"), OMP_NUM_THREADS="1",
               OSFL_PACK=str(tmp_path / "no_pack"))  # fmt: skip
    (tmp_path / "OUT").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_job_script_dry_run_writes_the_bundle_into_out(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    done = _job(tmp_path, "--minutes", "2", "--out", str(suite), "--dry-run", "--sections", "mfu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "suite budget 0.50 min, inner limit 60 s" in done.stdout
    out = tmp_path / "OUT"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["job.log", "plan.json", "rates.json", "records.tar.gz",
                     "reproduction_gpu.md", "rows.json"]  # fmt: skip
    assert all((out / f).stat().st_size <= 16 * 2**20 for f in files)
    plan = json.loads((out / "plan.json").read_text())
    assert [s["status"] for s in plan["steps"]] == ["done"] and plan["budget_min"] == 0.5
    assert json.loads((out / "rates.json").read_text())["tiny"] is True
    assert "mfu_vitb16_bf16: done" in (out / "job.log").read_text()


def test_the_job_script_refuses_a_limit_with_no_time_to_run(tmp_path: Path) -> None:
    done = _job(tmp_path, "--minutes", "1", "--dry-run", "--out", str(tmp_path / "s"))
    assert done.returncode == 2 and "leaves no time to run" in done.stderr


def test_the_job_stops_at_once_when_osfl_cannot_start(tmp_path: Path) -> None:
    """A package missing from the carried wheels costs no device minute: the
    script says so in the bundle's log and exits 2 before measuring."""
    env_python = tmp_path / "python"
    env_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: omegaconf' >&2\nexit 1\n")
    env_python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("OSFL_CIFAR10", "PYTHONPATH")}
    env.update(PYTHON=str(env_python), OUT=str(tmp_path / "OUT"),
               OSFL_PACK=str(tmp_path / "no_pack"))  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "s")], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "osfl cannot start here" in done.stderr
    log = (tmp_path / "OUT" / "job.log").read_text()
    assert "ModuleNotFoundError: omegaconf" in log and "cannot start" in log
