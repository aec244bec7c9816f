"""The one command of a lent-GPU job, ``scripts/gpu_job.sh`` (issues #40,
#50), in a CPU dry run: the very script a job runs (install what is carried,
check what the catalogue imports, preflight, measure, plan, run under the
inner timeout, write the bundle into ``$OUT``), on the catalogue's tiny MFU
step; its margins are ``osfl.suite.lease``'s, and ``--minutes`` takes
decimals."""

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
    # a first command: the lease's later one gets what is left (capped at 10 minutes)
    assert "suite budget 1.00 min, inner limit 75 s, later command 10 min" in done.stdout
    out = tmp_path / "OUT"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["job.log", "plan.json", "rates.json", "records.tar.gz",
                     "reproduction_gpu.md", "rows.json"]  # fmt: skip
    assert all((out / f).stat().st_size <= 16 * 2**20 for f in files)
    plan = json.loads((out / "plan.json").read_text())
    assert [s["status"] for s in plan["steps"]] == ["done"] and plan["budget_min"] == 1.0
    assert plan["then_min"] == 10.0 and plan["preflight"]["ok"] is True
    assert json.loads((out / "rates.json").read_text())["tiny"] is True
    assert "mfu_vitb16_bf16: done" in (out / "job.log").read_text()


def _fake_python(tmp_path: Path) -> Path:
    """A ``python`` that passes the start check and prints what ``osfl suite
    run`` was given (the script's arithmetic, without a run)."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\ncase "$1" in -c) exit 0 ;; esac\necho "ARGS: $*"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize(
    ("minutes", "budget", "inner", "then"),
    [("8.5", "7.50", "465", "5.5"), ("10", "9.00", "555", "4"), ("12.75", "11.75", "720", "0")],
)
def test_minutes_take_decimals_and_the_later_command_gets_what_is_left(
    tmp_path: Path, minutes: str, budget: str, inner: str, then: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OSFL_CIFAR10", "PYTHONPATH")}
    env.update(PYTHON=str(_fake_python(tmp_path)), OUT=str(tmp_path / "OUT"),
               OSFL_PACK=str(tmp_path / "no_pack"))  # fmt: skip
    suite = tmp_path / "s"
    argv = ["bash", str(SCRIPT), "--minutes", minutes, "--out", str(suite), "--dry-run"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (
        f"suite budget {budget} min, inner limit {inner} s, later command {then} min" in done.stdout
    )
    assert f"--budget {budget} --then {then} " in done.stdout
    # the lease's later command on the same machine (a plan is there): none after it
    (suite / "plan.json").write_text("{}")
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert f"--budget {budget} --then 0 " in again.stdout


def test_the_job_scripts_margins_are_the_planners() -> None:
    """The plan's lease (osfl.suite.lease) and the script agree on what a
    command's minutes leave for the suite."""
    from osfl.suite import lease

    text = SCRIPT.read_text()
    for name in ("INNER_MARGIN_S", "BUDGET_MARGIN_S", "LEASE_MINUTES", "START_MINUTES"):
        assert f"\n{name}={getattr(lease, name):g}\n" in text, name


def test_the_job_script_refuses_minutes_that_are_not_a_number(tmp_path: Path) -> None:
    done = _job(tmp_path, "--minutes", "8,5", "--dry-run", "--out", str(tmp_path / "s"))
    assert done.returncode == 2 and "takes a number of minutes" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


def test_the_start_check_imports_datasets_and_flwr_datasets(tmp_path: Path) -> None:
    """A package the catalogue needs that is broken or missing on the machine
    (here ``flwr_datasets``, shadowed) stops the job before any minute is
    spent, the import error in the bundle's log."""
    broken = tmp_path / "site" / "flwr_datasets"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('flwr_datasets is broken here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OSFL_CIFAR10", "PYTHONPATH")}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path / "OUT"), PYTHONPATH=str(tmp_path / "site"),
               OSFL_PACK=str(tmp_path / "no_pack"))  # fmt: skip
    (tmp_path / "OUT").mkdir()
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path / "s")],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "osfl cannot start here" in done.stderr
    assert "flwr_datasets is broken here" in (tmp_path / "OUT" / "job.log").read_text()


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
