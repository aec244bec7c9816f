"""benchmarks/select_on_validation.py: a setting is chosen on validation
accuracy, never on test accuracy, and separately per sweep point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfl.record import RunRecord
from support.scripts import load_script


def _selector():
    return load_script("benchmarks/select_on_validation.py")


def _record(method: str, alpha: float, seed: int, val: float, test: float) -> dict:
    return {
        "method": method,
        "seed": seed,
        "point": f"partition.alpha={alpha}",
        "validation_accuracy": val,
        "global_test_accuracy": test,
    }


def _run(tmp_path: Path, name: str, records: list[dict]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"records": records}))
    return str(d)


def test_each_sweep_point_is_chosen_on_validation_alone(tmp_path: Path) -> None:
    sel = _selector()
    # lr_a: better validation at alpha 0.1, worse at 1.0; its test scores say the opposite
    a = _run(tmp_path, "lr_a", [
        _record("eftvit", 0.1, 0, 0.60, 0.40), _record("eftvit", 0.1, 1, 0.62, 0.42),
        _record("eftvit", 1.0, 0, 0.50, 0.90), _record("eftvit", 1.0, 1, 0.50, 0.90),
    ])  # fmt: skip
    b = _run(tmp_path, "lr_b", [
        _record("eftvit", 0.1, 0, 0.50, 0.90), _record("eftvit", 0.1, 1, 0.50, 0.90),
        _record("eftvit", 1.0, 0, 0.70, 0.30), _record("eftvit", 1.0, 1, 0.70, 0.30),
    ])  # fmt: skip
    out = tmp_path / "choice.json"
    assert sel.main([a, b, "--per-seed", str(out)]) == 0
    dump = json.loads(out.read_text())
    assert dump["eftvit @ partition.alpha=0.1"]["chosen"] == "lr_a"
    assert dump["eftvit @ partition.alpha=1.0"]["chosen"] == "lr_b"
    cands = dump["eftvit @ partition.alpha=0.1"]["candidates"]
    assert cands["lr_a"] == {"validation": {"0": 60.0, "1": 62.0}, "test": {"0": 40.0, "1": 42.0}}


def test_a_record_without_a_point_is_chosen_by_method(tmp_path: Path) -> None:
    sel = _selector()

    def key(**r: str) -> str:
        return sel.choice_key(RunRecord.from_dict({"method": "fedavg", "seed": 0, **r}))

    assert key(point="") == "fedavg"
    assert key() == "fedavg"
    assert key(point="partition.alpha=0.1") == "fedavg @ partition.alpha=0.1"


def test_clients_own_models_are_chosen_and_reported_on_their_mean(tmp_path: Path) -> None:
    """A record with clients' own models (EFTViT, version 3 names): its
    setting is chosen on the clients' validation mean and reports their test
    mean, never the server predictor's numbers beside them."""
    sel = _selector()

    def own(val: float, test: float) -> dict:
        r = {"method": "eftvit", "seed": 0, "global_test_accuracy": 0.99}
        r |= {"validation_accuracy": 0.99, "mean_client_accuracy": test}
        r |= {"mean_client_validation_accuracy": val}
        return r

    def run(name: str, rec: dict) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"schema_version": 3, "records": [rec]}))
        return str(d)

    a, b = run("lr_a", own(0.6, 0.4)), run("lr_b", own(0.5, 0.9))
    out = tmp_path / "choice.json"
    assert sel.main([a, b, "--per-seed", str(out)]) == 0
    dump = json.loads(out.read_text())["eftvit"]
    assert dump["chosen"] == "lr_a"
    assert dump["candidates"]["lr_a"] == {"validation": {"0": 60.0}, "test": {"0": 40.0}}


def test_two_records_of_one_choice_and_seed_are_refused(tmp_path: Path) -> None:
    sel = _selector()
    twice = _run(tmp_path, "twice", [_record("fedavg", 0.1, 0, 0.5, 0.5)] * 2)
    with pytest.raises(SystemExit, match=r"two records of fedavg @ partition\.alpha=0\.1, seed 0"):
        sel.main([twice])


def test_a_record_without_validation_is_refused(tmp_path: Path) -> None:
    sel = _selector()
    r = _record("fedavg", 0.1, 0, 0.5, 0.5)
    del r["validation_accuracy"]
    with pytest.raises(SystemExit, match="no validation_accuracy"):
        sel.main([_run(tmp_path, "noval", [r])])


def test_final_runs_add_the_chosen_settings_seeds(tmp_path: Path) -> None:
    sel = _selector()

    def rec(seed: int, val: float, test: float, chosen: tuple[int, float] | None) -> dict:
        r = _record("fedavg", 0.1, seed, val, test)
        if chosen is not None:
            r["best_on_validation"] = {"round": chosen[0], "validation_accuracy": val,
                                       "accuracy": chosen[1]}  # fmt: skip
        return r

    a = _run(tmp_path, "lr_a", [rec(0, 0.60, 0.40, (4, 0.45))])
    b = _run(tmp_path, "lr_b", [rec(0, 0.50, 0.90, (2, 0.95))])
    final_a = _run(tmp_path, "more_a", [rec(1, 0.6, 0.50, (9, 0.55)), rec(2, 0.6, 0.60, None)])
    out = tmp_path / "choice.json"
    assert sel.main([a, b, "--final", final_a, "--per-seed", str(out)]) == 0
    final = json.loads(out.read_text())["fedavg @ partition.alpha=0.1"]["final"]
    assert final["accuracy"] == {"0": 40.0, "1": 50.0, "2": 60.0}
    assert final["on_validation"] == {"0": 45.0, "1": 55.0}  # seed 2 has no curve
    assert final["rounds"] == [5, 10]  # counted from 1


def test_a_seed_in_both_the_grid_and_a_final_run_is_refused(tmp_path: Path) -> None:
    sel = _selector()
    a = _run(tmp_path, "lr_a", [_record("fedavg", 0.1, 0, 0.6, 0.4)])
    again = _run(tmp_path, "again", [_record("fedavg", 0.1, 0, 0.6, 0.4)])
    with pytest.raises(SystemExit, match="seed 0 of fedavg"):
        sel.main([a, "--final", again])
