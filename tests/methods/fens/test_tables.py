"""benchmarks/fens_tables.py: REPRODUCTION's FENS rows are labelled by the
options where a record differs from FENS's defaults, and kept apart by run."""

from __future__ import annotations

import dataclasses
import json

from osfl.methods.fens import FENSConfig
from support.scripts import load_script


def _module():
    return load_script("benchmarks/fens_tables.py")


def test_labels_name_the_options_that_differ_from_the_defaults():
    tables = _module()
    defaults = dataclasses.asdict(FENSConfig())
    assert tables.label({"method": "fens", "method_config": defaults}) == "fens"
    changed = {**defaults, "holdout": 0.0, "server_opt": {**defaults["server_opt"], "lr": 0.01}}
    got = tables.label({"method": "fens", "method_config": changed})
    assert got == "fens[holdout=0.0, server_opt.lr=0.01]"
    assert tables.label({"method": "ensemble", "method_config": {"x": 1}}) == "ensemble"


def test_runs_are_kept_apart_and_per_seed_values_written(tmp_path, monkeypatch, capsys):
    tables = _module()
    records = {
        "a": [(0, 0.5), (1, 0.25)],
        "b": [(0, 0.75)],
    }
    loaded = {}
    for run, seeds in records.items():
        (tmp_path / run).mkdir()
        loaded[str(tmp_path / run / "metrics.json")] = {
            "records": [
                {
                    "method": "fens",
                    "method_config": dataclasses.asdict(FENSConfig()),
                    "point": "partition.alpha=0.1",
                    "seed": s,
                    "global_test_accuracy": acc,
                    "bytes_up": 3 * 2**20,
                    "bytes_down": 2**20,
                }
                for s, acc in seeds
            ]
        }
    monkeypatch.setattr(tables, "read_metrics", lambda path: loaded[str(path)])
    out = tmp_path / "per_seed.json"
    assert tables.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    per_seed = json.loads(out.read_text())
    assert per_seed == {
        "a|fens|partition.alpha=0.1": {"0": 50.0, "1": 25.0},
        "b|fens|partition.alpha=0.1": {"0": 75.0},
    }
    printed = capsys.readouterr().out
    assert "| a | fens | partition.alpha=0.1 | 4.00 MiB | 37.50 ± 17.68 | 2 |" in printed
    assert "| b | fens | partition.alpha=0.1 | 4.00 MiB | 75.00 | 1 |" in printed
