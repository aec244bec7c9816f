"""benchmarks/eftvit_tables.py: the values REPRODUCTION's EFTViT rows are read
from (both predictors, best rounds, rounds to a target), checked by hand on
small records."""

from __future__ import annotations

import json
from pathlib import Path

from support.scripts import load_script


def _tables():
    return load_script("benchmarks/eftvit_tables.py")


CURVE = [
    {"round": 0, "accuracy": 0.30, "server_accuracy": 0.35},
    {"round": 1, "accuracy": 0.45, "server_accuracy": 0.35},
    {"round": 2, "accuracy": 0.50, "server_accuracy": 0.55},
    {"round": 3, "accuracy": 0.50, "server_accuracy": 0.41},
    {"round": 4, "accuracy": 0.42},  # an evaluation without the server's score
]


def _record(method: str = "eftvit", alpha: float = 0.1, lr: float = 1e-5, seed: int = 0) -> dict:
    return {
        "method": method,
        "seed": seed,
        "partition": {"scheme": "dirichlet", "params": {"alpha": alpha}},
        "train": {"lr": lr},
        "rounds": 5,
        "mean_client_accuracy": 0.42,  # record version 2: the clients' own models' mean
        "global_test_accuracy": 0.41,  # the server predictor's (= server_accuracy)
        "server_accuracy": 0.41,
        "client_accuracies": [0.5, None, 0.34],
        "clients_not_sampled": [1],
        "curve": CURVE,
    }


def test_first_reaching_counts_rounds_from_one_and_needs_the_key() -> None:
    t = _tables()
    assert t.first_reaching(CURVE, "accuracy", 0.45) == 2  # round index 1, reached exactly
    assert t.first_reaching(CURVE, "accuracy", 0.46) == 3
    assert t.first_reaching(CURVE, "server_accuracy", 0.5) == 3
    assert t.first_reaching(CURVE, "accuracy", 0.51) is None
    assert t.first_reaching(CURVE, "server_accuracy", 0.0) == 1
    assert t.first_reaching([], "accuracy", 0.0) is None


def test_best_is_the_first_round_at_the_highest_value() -> None:
    t = _tables()
    assert t.best(CURVE, "accuracy") == (50.0, 3)  # rounds 3 and 4 tie: the earlier
    assert t.best(CURVE, "server_accuracy") == (55.0, 3)
    assert t.best(CURVE, "missing") is None


def test_row_reads_both_predictors_and_the_target_of_its_beta() -> None:
    t = _tables()
    r = t.row(_record(), {0.1: 0.4, 1.0: 0.55})
    assert (r["lr"], r["alpha"], r["seed"], r["rounds"]) == (1e-5, 0.1, 0, 5)
    assert (r["clients_mean"], r["server"]) == (42.0, 41.0)
    assert r["clients"] == [50.0, None, 34.0]
    assert r["clients_not_sampled"] == [1]
    assert r["best_clients_mean"] == (50.0, 3)
    assert r["best_server"] == (55.0, 3)
    assert r["target"] == 0.4
    assert r["rounds_to_target_clients_mean"] == 2
    assert r["rounds_to_target_server"] == 3
    assert r["on_validation"] is None  # a run without a validation split
    # no target for this β: no target keys
    assert "target" not in t.row(_record(alpha=0.5), {0.1: 0.4})


def test_collect_keeps_eftvit_records_sorted_and_the_table_marks_gaps(tmp_path: Path) -> None:
    t = _tables()
    records = [
        _record(alpha=1.0, lr=1e-5),
        _record(method="fedfull"),
        _record(alpha=0.1, lr=3e-5),
        _record(alpha=0.1, lr=1e-5),
    ]
    (tmp_path / "metrics.json").write_text(json.dumps({"records": records}))
    rows = t.collect([str(tmp_path)], {0.1: 0.6})
    assert [(r["alpha"], r["lr"]) for r in rows] == [(0.1, 1e-5), (0.1, 3e-5), (1.0, 1e-5)]
    assert {r["run"] for r in rows} == {tmp_path.name}
    lines = t.markdown(rows)
    assert len(lines) == 2 + 3
    assert lines[2].startswith(
        f"| {tmp_path.name} | 0.1 | 1e-05 | 0 | 42.0 | 41.0 | 50.0 (3) | 55.0 (3) "
    )
    # β 0.1: 60 % never reached by either predictor; β 1.0 has no target
    assert lines[2].endswith("| 34.0–50.0 | 60 %: – / – |")
    assert lines[4].endswith("| 34.0–50.0 |  |")


def test_the_round_chosen_on_validation_is_read_from_the_record() -> None:
    t = _tables()
    record = {
        **_record(),
        "best_on_validation": {"round": 1, "validation_accuracy": 0.47, "accuracy": 0.45},
    }
    r = t.row(record, {})
    assert r["on_validation"] == (
        2,
        47.0,
        45.0,
    )  # round index 1 = round 2; test 45 %, not the best 50
    line = t.markdown([r])[-1]
    assert "| 2: 45.0 |" in line
    assert "| – |" in t.markdown([t.row(_record(), {})])[-1]
