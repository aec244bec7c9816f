"""``osfl eval RUN_DIR [--data SPEC] [--method NAME]``: the kept models of a
run scored again, one table row each; a run without them, a method without
one, other data of another class count: one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from osfl.cli import main
from support.smoke import exit_2, tiny_cli_args


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("eval")
    out = tmp / "run"
    assert main(["run", *tiny_cli_args(tmp, "fedavg,local"), "--out", str(out)]) == 0
    return out


def test_eval_prints_the_card_and_the_new_accuracy_of_each_kept_model(run, capsys) -> None:
    (record,) = [
        r
        for r in json.loads((run / "metrics.json").read_text())["records"]
        if r["method"] == "fedavg"
    ]
    percent = f"{100 * record['global_test_accuracy']:.2f}"
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"kept models of {run}, scored on the run's test split" in out
    rows = [line.split() for line in out.splitlines() if "fedavg" in line]
    assert rows == [["│", "fedavg", "│", "0", "│", *[percent, "│"] * 3, "451", "│", "yes", "│"]]
    assert "local" not in out  # no server model, nothing kept


def test_eval_names_other_data_in_its_notes(run, capsys) -> None:
    capsys.readouterr()
    assert main(["eval", str(run), "--data", "digits", "--method", "fedavg"]) == 0
    out = capsys.readouterr().out
    assert "scored on digits: the cards' accuracies are on the run's own test split" in out
    assert "yes" in out  # the run's own source at its own size: the very test split


def test_eval_refusals_are_one_line(run, tmp_path, capsys) -> None:
    line = exit_2(capsys, ["eval", str(run), "--method", "local"])
    assert line == (
        f"osfl: error: --method local: {run} keeps no model of it (kept: fedavg; a method "
        "without a server model, e.g. local, keeps none)"
    )
    bare = Path(shutil.copytree(run, tmp_path / "bare"))
    shutil.rmtree(bare / "models")
    assert "keeps no models (models/ is missing or empty)" in exit_2(capsys, ["eval", str(bare)])
    line = exit_2(capsys, ["eval", str(tmp_path)])
    assert line.endswith(
        "is not an osfl run directory (no config.yaml); pass the directory `osfl run` printed"
    )
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("ant", "bee", "cat"):
            (tmp_path / "three" / split / c).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels, mode="L").save(tmp_path / "three" / split / c / f"{i}.png")
    spec = f"imagefolder:{tmp_path / 'three'}"
    assert exit_2(capsys, ["eval", str(run), "--data", spec]) == (
        f"osfl: error: --data {spec} has 3 classes; the run's models score 10 "
        "(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"
    )


def test_eval_help_names_its_options(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("RUN_DIR", "--data SPEC", "--all", "--method", "--device"))


def test_a_difference_from_the_record_is_exit_1_and_named(run, tmp_path, capsys) -> None:
    """Detected mismatches ("equal: no") used to exit 0."""
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    doc = json.loads((copy / "metrics.json").read_text())
    for r in doc["records"]:
        if r["method"] == "fedavg":
            r["global_test_accuracy"] = 0.5366
    (copy / "metrics.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["eval", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "53.66" in out
    assert (
        "fedavg seed 0 differs: the card's accuracy differs from metrics.json's; the accuracy "
        "now differs from metrics.json's"
    ) in " ".join(out.split())
