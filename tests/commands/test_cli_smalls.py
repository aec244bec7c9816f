"""The small things a new user trips over (issue 44, item 6), each one line
that says what happened: a sweep split by the shell at a space, a YAML
syntax error with its line and column, a resume that differs only in
``--no-progress``, and a live display that names the seed it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.fl.progress import Progress, ProgressTask
from support.smoke import exit_2, tiny_cli_args


def test_a_sweep_split_at_a_space_says_so_with_the_command_that_works(capsys) -> None:
    line = exit_2(capsys, ["run", "--sweep", "partition.alpha=0.1,", "1.0"])
    assert "config file not found" not in line
    assert "split its values at a space" in line and "'1.0' was taken for a config file" in line
    assert "--sweep partition.alpha=0.1,1.0" in line
    line = exit_2(capsys, ["run", "--sweep", "methods=fedavg,", "local"])
    assert "--sweep methods=fedavg,local" in line


def test_a_yaml_syntax_error_keeps_its_line_and_column(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 1\n  lr: [0.1\nmethods: [fedavg]\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    assert "line 4, column 8" in text and "did not find expected ',' or ']'" in text
    assert "flow sequence at line 3, column 7" in text and "\n" not in text
    line = exit_2(capsys, ["run", str(bad)])
    assert line.startswith(f"osfl: error: cannot parse {bad}, line 4, column 8: ")


def test_a_resume_may_differ_in_the_progress_display_only(tmp_path: Path, capsys) -> None:
    """A run started with the live display resumes with ``--no-progress``;
    any key that changes a number is still refused."""
    out = tmp_path / "run"
    args = tiny_cli_args(tmp_path, "fedavg,local", progress=True)
    assert main(["run", *args, "--out", str(out)]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = doc["records"][:1]  # "stopped" after the first method
    (out / "metrics.json").write_text(json.dumps(doc))
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["records"]) == 2
    line = exit_2(capsys, ["run", "--resume", str(out), "train.epochs=3"])
    assert "train.epochs (3 here, 1 in the run)" in line and "progress" not in line


class _Board(Progress):
    """Keeps every description a bar was given."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def task(self, description: str, total: float | None = None) -> ProgressTask:
        seen = self.seen
        seen.append(description)

        class Task(ProgressTask):
            def advance(self, amount: float = 1.0, *, description: str | None = None) -> None:
                if description is not None:
                    seen.append(description)

        return Task()


def test_the_live_display_names_the_method_and_seed_it_runs() -> None:
    cfg = load_config(
        None,
        [
            "data.image_size=8",
            "data.max_per_class=10",
            "partition.num_clients=2",
            "partition.alpha=1.0",
            "partition.min_partition_size=2",
            "train.epochs=1",
            "methods=[fedavg]",
            "seeds=[0,1]",
            "cache_dir=null",
        ],
    )
    board = _Board()
    run_experiment(cfg, progress=board)
    assert "fedavg, seed 0" in board.seen and "fedavg, seed 1" in board.seen
    assert board.seen.index("fedavg, seed 0") < board.seen.index("fedavg, seed 1")


def test_check_docs_k_that_matches_no_block_fails_and_its_own_example_matches(capsys) -> None:
    """``-k`` with a mistyped keyword ran nothing and exited 0, the docstring's
    own example (``-k default``) among them."""
    import re

    from support.scripts import ROOT, load_script

    check_docs = load_script("scripts/check_docs.py")
    assert check_docs.main([str(ROOT / "README.md"), "-k", "no-such-command-xyz"]) == 2
    assert "no doccheck block's command contains 'no-such-command-xyz'" in capsys.readouterr().err
    example = re.search(r"check_docs\.py (\S+) -k (\S+)", check_docs.__doc__)
    assert example is not None
    path, keyword = ROOT / example.group(1), example.group(2)
    assert any(keyword in b.command for b in check_docs.blocks(path)), keyword


def test_the_curves_band_stays_within_0_and_100_percent() -> None:
    from osfl import report

    recs = [
        {"method": "fedavg", "seed": s, "curve": [{"round": r, "accuracy": a} for r in range(3)]}
        for s, a in enumerate((0.99, 1.0, 0.97))
    ]
    fig = report.curves_figure(recs)
    (band,) = fig.axes[0].collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    assert max(ys) <= 100.0 and max(ys) > 99.0


def test_the_frontier_has_error_bars_separate_labels_and_local_as_a_level() -> None:
    """Two seeds: ± std bars; FedAvg and Ensemble send the same bytes, so
    their labels take opposite sides; ``local`` federates nothing, so it is a
    dashed level line, not a point that communicated."""
    from osfl import report

    kib = 1024
    accs = {"local": (0.60, 0.64), "fedavg": (0.62, 0.61), "ensemble": (0.70, 0.74)}
    recs = [
        {"method": m, "seed": s, "global_test_accuracy": a[s], "bytes_up": 500 * kib,
         "bytes_down": 465 * kib, "regime": "scratch"}
        for m, a in accs.items()
        for s in (0, 1)
    ]  # fmt: skip
    fig = report.frontier_figure(recs)
    (ax,) = fig.axes
    scattered = {c.get_label() for c in ax.collections if c.get_label() in accs}
    assert scattered == {"fedavg", "ensemble"}
    level = [ln for ln in ax.get_lines() if ln.get_label() == "local (no federation)"]
    assert len(level) == 1 and level[0].get_ydata()[0] == pytest.approx(62.0)
    assert len(ax.containers) == 2  # the two error bars
    sides = {t.get_text().split("\n")[0]: t.get_ha() for t in ax.texts}
    assert {sides["fedavg"], sides["ensemble"]} == {"left", "right"}
    assert any(t.get_text().startswith("local\nno federation") for t in ax.texts)
