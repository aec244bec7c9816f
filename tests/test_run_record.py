"""A finished job's record as ``osfl.run_record`` builds it: the curve of a
multi-round run carries the validation accuracy of every evaluation, and
``best_on_validation`` names the round whose validation accuracy is highest
with that round's test accuracy beside the final one; and a run directory's
every file (metrics.json, events.jsonl, summary.md, TensorBoard's scalars,
the curve and its plot) holds each accuracy under its one name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from osfl import report
from osfl.cli import main
from osfl.config import load_config
from osfl.experiment import run_experiment
from osfl.fl.method import METHODS
from osfl.record import RunRecord
from osfl.report import read_metrics
from support.smoke import tiny_cli_args
from support.tiny import TINY_SPLIT


def test_records_carry_validation_accuracy_and_the_best_round() -> None:
    cfg = load_config(
        None,
        [
            *TINY_SPLIT,
            "data.validation_fraction=0.2",
            "methods=[fedavg]",
            "method.fedavg.rounds=3",
            "train.epochs=1",
            "eval_every=1",
            "progress=false",
        ],
    )
    (record,) = run_experiment(cfg)
    assert 0.0 <= record.extra("validation_accuracy") <= 1.0
    assert all(p.validation_accuracy is not None for p in record.curve)
    best = record.best_on_validation
    assert best is not None and set(best) == {
        "round",
        "validation_accuracy",
        "global_test_accuracy",
    }
    assert best["validation_accuracy"] == max(p.validation_accuracy for p in record.curve)
    assert best["global_test_accuracy"] == next(
        p.global_test_accuracy for p in record.curve if p.round == best["round"]
    )


# --------------------------------------------------------------------------- one name per number
# A run directory's every file, read back: each accuracy under its one name
# with its one meaning (issue 53): ``global_test_accuracy`` is the server
# predictor's in the round events, the curve, convergence, the trackers, the
# record and the table; the clients' own models' mean is only
# ``mean_client_accuracy``; ``local`` (no server predictor) has a null
# ``global_test_accuracy`` everywhere.

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="the tensorboard extra"
)

#: Names a version-2 run wrote for the same numbers: none may appear again.
OLD_NAMES = {"server_accuracy", "server_per_class_accuracy", "server_validation_accuracy"}
OLD_NAMES |= {"server_local_test_accuracy", "accuracy"}


def _run(tmp: Path, methods: str, *args: str) -> Path:
    out = tmp / "run"
    argv = [*tiny_cli_args(tmp, methods), "eval_every=1", "data.validation_fraction=0.2"]
    if methods == "eftvit":  # a ViT: none of the CNN's width
        argv = [a for a in argv if not a.startswith("model.kwargs=")]
    argv += ["eval_local=true", "logger=[tensorboard]", "target_accuracy=0.05", *args]
    assert main(["run", *argv, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def eftvit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EFTViT (clients' own models beside a server predictor), two rounds."""
    smoke = METHODS.get("eftvit").card.smoke
    return _run(tmp_path_factory.mktemp("eftvit"), "eftvit", *smoke)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FedAvg (a server predictor only), three rounds, and ``local`` (none)."""
    return _run(tmp_path_factory.mktemp("fedavg"), "fedavg,local", "method.fedavg.rounds=3")


def _events(out: Path, kind: str, method: str) -> list[dict[str, Any]]:
    lines = (out / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [e for e in events if e["event"] == kind and e.get("method") == method]


def _tensorboard(out: Path, tag: str) -> list[tuple[int, float]]:
    acc = event_accumulator.EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _f32(x: float) -> float:
    return float(np.float32(x))


def _table_row(out: Path, method: str) -> dict[str, str]:
    """``summary.md``'s first table's row of ``method``, by column."""
    lines = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {method} |"))
    return dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))


def _no_old_name(node: Any, where: str) -> None:
    """No key of a version-2 name anywhere in ``node``."""
    if isinstance(node, dict):
        assert not OLD_NAMES & set(node), (where, sorted(OLD_NAMES & set(node)))
        for k, v in node.items():
            _no_old_name(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _no_old_name(v, f"{where}[{i}]")


def _check_every_file(out: Path, method: str) -> RunRecord:
    """The numbers of ``method``'s record in metrics.json, events.jsonl,
    the curve, convergence, TensorBoard and summary.md, each under its name."""
    raw = json.loads((out / "metrics.json").read_text())
    _no_old_name(raw["records"], "metrics.json")
    (record,) = [r for r in read_metrics(out / "metrics.json")["records"] if r.method == method]
    rounds = [e for e in _events(out, "round", method) if "metrics" in e]
    _no_old_name(rounds, "events.jsonl")
    # the curve is the round events' evaluations, name for name
    assert [p.round for p in record.curve] == [e["round"] for e in rounds]
    for p, e in zip(record.curve, rounds, strict=True):
        assert p.global_test_accuracy == e["metrics"]["global_test_accuracy"]
        assert p.mean_client_accuracy == e["metrics"].get("mean_client_accuracy")
        assert p.validation_accuracy == e["metrics"].get("validation_accuracy")
    # the last round's evaluation is the record's, and the end-of-run event's
    last = rounds[-1]["metrics"]
    (end,) = _events(out, "method_end", method)
    assert record.global_test_accuracy == last["global_test_accuracy"]
    assert end["global_test_accuracy"] == record.global_test_accuracy
    assert record.mean_client_accuracy == last.get("mean_client_accuracy")
    assert end.get("mean_client_accuracy") == record.mean_client_accuracy
    assert record.local_test_accuracy == last.get("local_test_accuracy")
    assert record.extra("validation_accuracy") == last.get("validation_accuracy")
    # TensorBoard: each round's scalar under the same name, the ranked one as `accuracy`
    tag = f"{method}/seed0"
    curve = [(p.round, _f32(p.ranked_accuracy)) for p in record.curve if p.ranked_accuracy]
    assert _tensorboard(out, f"{tag}/accuracy") == (curve if len(curve) > 1 else [])
    final = [(len(record.curve) and record.curve[-1].round, _f32(record.ranked_accuracy))]
    assert _tensorboard(out, f"{tag}/final/accuracy") == final
    return record


def test_an_eftvit_run_directory_names_each_accuracy_once(eftvit_run: Path) -> None:
    r = _check_every_file(eftvit_run, "eftvit")
    assert r.global_test_accuracy is not None and r.mean_client_accuracy is not None
    assert len(r.curve) == 2
    assert all(p.mean_client_accuracy is not None for p in r.curve)
    # the server's accuracy and the clients' mean are both TensorBoard curves, each its own
    for key in ("global_test_accuracy", "mean_client_accuracy"):
        assert _tensorboard(eftvit_run, f"eftvit/seed0/{key}") == [
            (p.round, _f32(getattr(p, key))) for p in r.curve
        ]
    # per class, validation and the clients' own label mixes: the clients' under their names
    assert len(r.extra("per_class_accuracy")) == len(r.extra("mean_client_per_class_accuracy"))
    assert r.extra("mean_client_validation_accuracy") == r.curve[-1].mean_client_validation_accuracy
    assert r.mean_client_local_test_accuracy == pytest.approx(
        float(np.mean(r.extra("client_local_test_accuracies")))
    )
    # convergence measures the ranked accuracy, the server predictor's
    assert r.convergence is not None and r.convergence["accuracy_key"] == "global_test_accuracy"
    assert r.convergence["best_accuracy"] == max(p.global_test_accuracy for p in r.curve)
    # the round chosen on validation: the clients' own models' (the paper's), named so
    assert r.best_on_validation is not None
    best = r.curve[r.best_on_validation["round"] - r.curve[0].round]
    assert dict(r.best_on_validation) == {
        "round": best.round,
        "mean_client_validation_accuracy": best.mean_client_validation_accuracy,
        "mean_client_accuracy": best.mean_client_accuracy,
    }
    assert best.mean_client_validation_accuracy == max(
        p.mean_client_validation_accuracy for p in r.curve
    )
    # the table: accuracy is the server's, the clients' mean its own column
    row = _table_row(eftvit_run, "eftvit")
    assert row["accuracy (%)"] == f"{100 * r.global_test_accuracy:.2f}"
    assert row["clients' own models (%)"] == f"{100 * r.mean_client_accuracy:.2f}"
    # the curves plot: the server predictor's accuracy per round
    (line,) = report.curves_figure([r]).axes[0].get_lines()
    assert list(line.get_ydata()) == [100 * p.global_test_accuracy for p in r.curve]


def test_a_fedavg_and_local_run_directory_names_each_accuracy_once(fedavg_run: Path) -> None:
    fedavg = _check_every_file(fedavg_run, "fedavg")
    assert len(fedavg.curve) == 3 and fedavg.mean_client_accuracy is None
    assert fedavg.convergence is not None
    assert fedavg.convergence["accuracy_key"] == "global_test_accuracy"
    assert fedavg.convergence["best_accuracy"] == max(p.global_test_accuracy for p in fedavg.curve)
    assert _tensorboard(fedavg_run, "fedavg/seed0/mean_client_accuracy") == []
    assert _table_row(fedavg_run, "fedavg")["accuracy (%)"] == (
        f"{100 * fedavg.global_test_accuracy:.2f}"
    )
    # local: no server predictor, so global_test_accuracy is null in every file
    local = _check_every_file(fedavg_run, "local")
    assert local.global_test_accuracy is None and local.mean_client_accuracy is not None
    assert [p.global_test_accuracy for p in local.curve] == [None]
    assert local.extra("per_class_accuracy") is None
    assert local.extra("mean_client_per_class_accuracy") is not None
    assert local.mean_client_local_test_accuracy is not None and local.local_test_accuracy is None
    assert _tensorboard(fedavg_run, "local/seed0/global_test_accuracy") == []
    row = _table_row(fedavg_run, "local")
    assert (
        row["accuracy (%)"] == f"{100 * local.mean_client_accuracy:.2f}{report.CLIENTS_MEAN_MARK}"
    )
