"""benchmarks/fens_tables.py: REPRODUCTION's FENS rows are labelled by the
options where a record differs from FENS's defaults, and kept apart by run."""

from __future__ import annotations

import dataclasses
import json

from osfl.methods.fens import FENSConfig
from osfl.record import RunRecord, typed
from support.scripts import load_script


def _module():
    return load_script("benchmarks/fens_tables.py")


def test_labels_name_the_options_that_differ_from_the_defaults():
    tables = _module()
    defaults = dataclasses.asdict(FENSConfig())

    def label(method: str, config: dict) -> str:
        return tables.label(
            RunRecord.from_dict({"method": method, "seed": 0, "method_config": config})
        )

    assert label("fens", defaults) == "fens"
    changed = {**defaults, "holdout": 0.0, "server_opt": {**defaults["server_opt"], "lr": 0.01}}
    got = label("fens", changed)
    assert got == "fens[holdout=0.0, server_opt.lr=0.01]"
    assert label("ensemble", {"x": 1}) == "ensemble"


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
    monkeypatch.setattr(
        tables, "read_metrics", lambda path: {"records": typed(loaded[str(path)]["records"])}
    )
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
