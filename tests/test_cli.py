"""The ``osfl`` entry point (``osfl.cli``: ``main``, ``build_parser``): any
user error is one line ``osfl: error: ...`` and exit status 2, from
``python -m osfl.cli`` too, never a traceback; ``key=value`` overrides may
follow the options, an unknown option is argparse's exit 2. Each command's
own work: ``tests/commands/``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from osfl.cli import main
from support.paths import ROOT
from support.smoke import exit_2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "bogus=1"], "valid keys at top level"),
        (["run", "methods=[nope]"], "unknown method 'nope'"),
        (["run", "method.fedavg.round=2"], "valid: client_fraction, rounds, weighting"),
        (["run", "missing.yaml"], "not found"),
        (["pretrain", "a.yaml", "b.yaml"], "two config files"),  # `run` composes several
        (["run", str(ROOT / "configs" / "kd_digits.yaml"), "missing.yaml"], "found: missing.yaml"),
        (["run", "--sweep", "alpha"], "key=v1,v2"),
        (["run", "--sweep", "model.name=cnn_small,resnet99"], "resnet99"),
        (["run", "partition.scheme=zipf"], "zipf"),
        (
            [
                "partition",
                "--dataset",
                "digits",
                "--scheme",
                "zipf",
                "--clients",
                "2",
                "--out",
                "x.json",
            ],
            "zipf",
        ),
        (
            [
                "partition",
                "--dataset",
                "nope",
                "--scheme",
                "iid",
                "--clients",
                "2",
                "--out",
                "x.json",
            ],
            "nope",
        ),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    line = exit_2(capsys, argv)
    assert line.startswith("osfl: error: ") and needle in line


def test_entry_point_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "osfl.cli", "run", "train.lr=-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("osfl: error:") and "lr" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_overrides_may_follow_options(tmp_path) -> None:
    out = tmp_path / "run"
    args = [
        "run",
        "configs/default.yaml",
        "--no-progress",
        "--out",
        str(out),
        "methods=[fedavg]",
        "train.epochs=1",
        "partition.num_clients=2",
        "cache_dir=null",
    ]
    assert main(args) in (0, None)
    assert "fedavg" in (out / "summary.md").read_text()
    with pytest.raises(SystemExit) as info:
        main(["run", "--no-progress", "--bogus-flag"])
    assert info.value.code == 2
