"""What a run says went wrong: local-training health checks and their
grouping in the summary (osfl.fl.training.training_health, osfl.report)."""

from __future__ import annotations

import math

from osfl import report
from osfl.fl.training import LR_HINT, training_health


def test_healthy_training_says_nothing() -> None:
    assert training_health(2.0, 0.5, 0.9, epochs=2) == ()


def test_rising_loss_and_unlearned_client_are_flagged_with_the_hint() -> None:
    found = training_health(0.8, 1.9, 0.3, epochs=2)
    assert len(found) == 2
    assert "rose from 0.8" in found[0] and "1.9" in found[0]
    assert "did not learn its own data: 30%" in found[1]
    assert all(LR_HINT in w for w in found)


def test_a_loss_that_barely_moved_is_noise_not_a_warning() -> None:
    # 1.70 -> 1.71: a small learning rate and fresh augmentations, not divergence.
    assert training_health(1.70, 1.71, 0.9, epochs=2) == ()
    assert len(training_health(1.70, 1.80, 0.9, epochs=2)) == 1


def test_non_finite_loss_is_one_divergence_warning() -> None:
    found = training_health(1.0, math.nan, 0.1, epochs=3)
    assert len(found) == 1 and found[0].startswith("local training diverged")


def test_a_fraction_of_an_epoch_is_not_judged() -> None:
    assert training_health(0.5, 2.0, 0.0, epochs=0.5) == ()


def _rose(seed: int, client: int, round: int, a: float, b: float) -> str:
    return (
        f"seed {seed}: client {client} (round {round}): the local loss rose from {a} "
        f"(first epoch) to {b} (last); {LR_HINT}"
    )


def test_repeated_client_warnings_fold_into_one_line_per_kind() -> None:
    warnings = [
        _rose(0, 7, 28, 0.885, 1.86),
        "seed 0: evaluation: 3 non-finite scores",
        _rose(0, 4, 3, 0.366, 0.385),
        f"seed 1: client 2 (round 9): did not learn its own data: 12% accuracy; {LR_HINT}",
        _rose(1, 4, 12, 0.2, 0.3),
    ]
    lines = report.group_warnings(warnings)
    assert len(lines) == 3  # the rising losses, the evaluation line, the single unlearned
    folded = lines[0]
    assert folded.startswith("3 client trainings (clients 4, 7; rounds 3–28; seeds 0, 1)")
    assert folded.endswith(warnings[0])  # the first occurrence quoted as the example
    assert lines[1] == warnings[1]  # not a client's round: kept as it was
    assert lines[2] == warnings[3]  # a kind seen once: kept as it was


def test_summary_lists_folded_warnings_under_the_method() -> None:
    records = [
        {
            "method": "eftvit",
            "seed": 0,
            "global_test_accuracy": 0.5,
            "warnings": [
                f"client {c} (round {r}): the local loss rose from 1 (first epoch) to 2 "
                f"(last); {LR_HINT}"
                for r in range(1, 31)
                for c in (1, 2)
            ],
        }
    ]
    rows = report.summarize(records)
    text = report.summary_markdown(rows, title="t")
    warned = text.split("## Warnings", 1)[1].strip().splitlines()
    assert warned == [
        "- eftvit: 60 client trainings (clients 1, 2; rounds 1–30; seeds 0), e.g. seed 0: "
        f"client 1 (round 1): the local loss rose from 1 (first epoch) to 2 (last); {LR_HINT}"
    ]
    assert "60 warnings, see below" in text


def test_a_warning_shared_by_methods_is_one_line_naming_them() -> None:
    # One cached client feeds every method of a one-shot run: its warning once.
    shared = f"client 5 (round 0): did not learn its own data: 47% accuracy; {LR_HINT}"
    records = [
        {"method": m, "seed": 2, "global_test_accuracy": 0.2, "warnings": [shared]}
        for m in ("fedavg", "ensemble", "adi")
    ]
    records.append(
        {"method": "fedmitr", "seed": 2, "global_test_accuracy": 0.2, "warnings": ["other"]}
    )
    lines = report.warning_lines(report.summarize(records))
    assert lines == [f"fedavg, ensemble, adi: seed 2: {shared}", "fedmitr: seed 2: other"]
