"""benchmarks/eftvit_tables.py: the values REPRODUCTION's EFTViT rows are read
from (both predictors, best rounds, rounds to a target), checked by hand on
small records."""

from __future__ import annotations

import json
from pathlib import Path

from osfl.record import SCHEMA_VERSION, CurvePoint, RunRecord
from support.scripts import load_script


def _tables():
    return load_script("benchmarks/eftvit_tables.py")


CURVE_JSON = [
    {"round": 0, "mean_client_accuracy": 0.30, "global_test_accuracy": 0.35},
    {"round": 1, "mean_client_accuracy": 0.45, "global_test_accuracy": 0.35},
    {"round": 2, "mean_client_accuracy": 0.50, "global_test_accuracy": 0.55},
    {"round": 3, "mean_client_accuracy": 0.50, "global_test_accuracy": 0.41},
    {"round": 4, "mean_client_accuracy": 0.42},  # an evaluation without the server's score
]
CURVE = [CurvePoint.from_dict(p) for p in CURVE_JSON]


def _record(method: str = "eftvit", alpha: float = 0.1, lr: float = 1e-5, seed: int = 0) -> dict:
    """A current (version 3) EFTViT record as metrics.json holds it."""
    return {
        "method": method,
        "seed": seed,
        "partition": {"scheme": "dirichlet", "params": {"alpha": alpha}},
        "train": {"lr": lr},
        "rounds": 5,
        "mean_client_accuracy": 0.42,  # the clients' own models' mean
        "global_test_accuracy": 0.41,  # the server predictor's
        "client_accuracies": [0.5, None, 0.34],
        "clients_not_sampled": [1],
        "curve": CURVE_JSON,
    }


def _typed(record: dict) -> RunRecord:
    return RunRecord.from_dict(record)


def test_first_reaching_counts_rounds_from_one_and_needs_the_key() -> None:
    t = _tables()
    clients, server = "mean_client_accuracy", "global_test_accuracy"
    assert t.first_reaching(CURVE, clients, 0.45) == 2  # round index 1, reached exactly
    assert t.first_reaching(CURVE, clients, 0.46) == 3
    assert t.first_reaching(CURVE, server, 0.5) == 3
    assert t.first_reaching(CURVE, clients, 0.51) is None
    assert t.first_reaching(CURVE, server, 0.0) == 1
    assert t.first_reaching([], clients, 0.0) is None


def test_best_is_the_first_round_at_the_highest_value() -> None:
    t = _tables()
    assert t.best(CURVE, "mean_client_accuracy") == (50.0, 3)  # rounds 3 and 4 tie: the earlier
    assert t.best(CURVE, "global_test_accuracy") == (55.0, 3)
    assert t.best(CURVE, "validation_accuracy") is None  # no point has it


def test_row_reads_both_predictors_and_the_target_of_its_beta() -> None:
    t = _tables()
    r = t.row(_typed(_record()), {0.1: 0.4, 1.0: 0.55})
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
    assert "target" not in t.row(_typed(_record(alpha=0.5)), {0.1: 0.4})


def test_collect_keeps_eftvit_records_sorted_and_the_table_marks_gaps(tmp_path: Path) -> None:
    t = _tables()
    records = [
        _record(alpha=1.0, lr=1e-5),
        _record(method="fedfull"),
        _record(alpha=0.1, lr=3e-5),
        _record(alpha=0.1, lr=1e-5),
    ]
    doc = {"schema_version": SCHEMA_VERSION, "records": records}
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
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
    chosen = {"round": 1, "mean_client_validation_accuracy": 0.47, "mean_client_accuracy": 0.45}
    r = t.row(_typed({**_record(), "best_on_validation": chosen}), {})
    assert r["on_validation"] == (
        2,
        47.0,
        45.0,
    )  # round index 1 = round 2; test 45 %, not the best 50
    line = t.markdown([r])[-1]
    assert "| 2: 45.0 |" in line
    assert "| – |" in t.markdown([t.row(_typed(_record()), {})])[-1]
    # a record whose server predictor chose (no clients' numbers): its names
    server = {"round": 0, "validation_accuracy": 0.3, "global_test_accuracy": 0.35}
    assert t.on_validation(_typed({**_record(), "best_on_validation": server})) == (1, 30.0, 35.0)
