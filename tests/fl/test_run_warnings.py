"""What a run says went wrong: local-training health checks and their
grouping in the summary (osfl.fl.training.training_health, osfl.report)."""

from __future__ import annotations

import math

from osfl import report
from osfl.fl.training import (
    LR_HINT,
    UNDERFIT_HINT,
    TrainingScope,
    stats_health,
    training_health,
    training_scope,
)

ONE_SHOT = TrainingScope()
ROUND_0 = TrainingScope(round=0, multi_round=True)
LATER_ROUND = TrainingScope(round=6, multi_round=True)


def _health(first, final, acc, epochs=3.0, classes=10, scope=ONE_SHOT):
    return training_health(first, final, acc, epochs, num_classes=classes, scope=scope)


def test_healthy_training_says_nothing() -> None:
    assert _health(2.0, 0.5, 0.9) == ()
    assert _health(2.0, 0.5, 0.9, scope=LATER_ROUND) == ()


def test_a_non_finite_loss_is_divergence_with_the_lower_rate_remedy() -> None:
    found = _health(1.0, math.nan, 0.1)
    assert len(found) == 1 and found[0].startswith("local training diverged")
    assert found[0].endswith(LR_HINT)


def test_a_loss_that_rose_from_scratch_is_divergence() -> None:
    # a client trained from the common initial weights: its loss must fall
    for scope in (ONE_SHOT, ROUND_0):
        found = _health(0.8, 1.9, 0.9, scope=scope)
        assert len(found) == 1
        assert "rose from 0.8" in found[0] and "1.9" in found[0] and found[0].endswith(LR_HINT)


def test_a_rise_in_a_later_round_below_chance_is_client_drift_not_a_warning() -> None:
    # baselines_digits, later FedAvg rounds: 0.444 -> 0.825 from the global model
    assert _health(0.444, 0.825, 0.8, epochs=2, scope=LATER_ROUND) == ()


def test_a_rise_in_a_later_round_above_chance_is_divergence() -> None:
    # worse than a uniform guess over 10 classes (ln 10 = 2.30)
    found = _health(0.9, 2.6, 0.1, epochs=2, scope=LATER_ROUND)
    assert len(found) == 1
    assert "above chance level (2.3 for 10 classes)" in found[0] and found[0].endswith(LR_HINT)


def test_a_loss_that_barely_moved_is_noise_not_a_warning() -> None:
    # 1.70 -> 1.71: a small learning rate and fresh augmentations, not divergence.
    assert _health(1.70, 1.71, 0.9, epochs=2) == ()
    assert len(_health(1.70, 1.80, 0.9, epochs=2)) == 1


def test_underfitting_is_judged_against_chance_for_the_number_of_classes() -> None:
    # 3 classes (chance 33%): 48% after 3 epochs is underfitting, with its own remedy
    found = _health(1.1, 1.0, 0.48, classes=3)
    assert len(found) == 1
    assert "did not fit its own data: 48%" in found[0] and "chance 33% for 3 classes" in found[0]
    assert found[0].endswith(UNDERFIT_HINT) and LR_HINT not in found[0]
    assert _health(1.1, 0.8, 0.55, classes=3) == ()
    # 10 classes (chance 10%): 40% is far above chance (the old fixed 50% fired), 30% is not
    assert _health(2.3, 1.9, 0.40) == ()
    assert "did not fit its own data: 30%" in _health(2.3, 2.2, 0.30)[0]


def test_one_round_of_a_multi_round_method_is_not_judged_for_fit() -> None:
    # rlu_audit_digits: 10 local steps per round; the global model learns over rounds
    assert _health(2.3, 2.3, 0.05, epochs=1, scope=ROUND_0) == ()
    assert _health(2.3, 2.3, 0.05, epochs=1, scope=LATER_ROUND) == ()


def test_without_logits_only_the_loss_is_judged() -> None:
    # a custom loss_fn (FAFI's contrastive loss): no accuracy, no number of classes
    assert training_health(2.0, 1.0, None, 3) == ()
    assert len(training_health(1.0, 2.0, None, 3)) == 1


def test_a_fraction_of_an_epoch_is_not_judged() -> None:
    assert _health(0.5, 2.0, 0.0, epochs=0.5) == ()


def test_the_scope_comes_from_the_active_block_and_cache_hits_are_judged_in_it() -> None:
    stats = {"first_loss": 0.444, "final_loss": 0.825, "train_accuracy": 0.8, "epochs": 2.0,
             "num_classes": 10, "warnings": ["stored"]}  # fmt: skip
    assert len(stats_health(stats)) == 1  # outside a runtime: a whole training, from scratch
    with training_scope(6, multi_round=True):
        assert training_health(0.444, 0.825, 0.8, 2, num_classes=10) == ()
        assert stats_health(stats) == ()
    # an entry stored without the numbers keeps its warnings
    assert stats_health({"warnings": ["stored"]}) == ("stored",)


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
