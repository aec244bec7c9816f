"""Rounds and time to a target accuracy (osfl.convergence); the table that
shows them is ``tests/report/test_tables.py``'s."""

from __future__ import annotations

import pytest

from osfl.convergence import convergence, link_seconds

CURVE = [
    {"round": 0, "global_test_accuracy": 0.40, "bytes": 1_000_000, "seconds": 2.0},
    {"round": 1, "global_test_accuracy": 0.62, "bytes": 2_000_000, "seconds": 4.0},
    {"round": 2, "global_test_accuracy": 0.58, "bytes": 3_000_000, "seconds": 6.0},
]


def test_rounds_and_time_to_target_hand_computed():
    c = convergence(CURVE, target_accuracy=0.6, link_mbps=8.0)  # 1 MB/s
    assert c is not None
    assert c["rounds_to_target"] == 2 and c["time_to_target_s"] == pytest.approx(4.0 + 2.0)
    assert c["total_time_s"] == pytest.approx(6.0 + 3.0)
    assert c["best_accuracy"] == 0.62 and c["best_round"] == 2
    assert c["accuracy_key"] == "global_test_accuracy"
    assert link_seconds(CURVE[0], 500.0) == pytest.approx(2.0 + 8e6 / 500e6)


def test_an_unreached_target_and_no_target():
    never = convergence(CURVE, target_accuracy=0.9, link_mbps=500.0)
    assert never is not None and never["rounds_to_target"] is None
    assert never["time_to_target_s"] is None
    none = convergence(CURVE, target_accuracy=None, link_mbps=500.0)
    assert none is not None and none["rounds_to_target"] is None and none["total_time_s"] > 6.0


def test_no_convergence_without_a_costed_curve():
    assert convergence(CURVE[:1], target_accuracy=0.5, link_mbps=500.0) is None
    old = [
        {"round": r, "global_test_accuracy": 0.5} for r in range(3)
    ]  # a record from before the costs
    assert convergence(old, target_accuracy=0.5, link_mbps=500.0) is None


def test_the_ranked_accuracy_is_measured_and_named():
    """EFTViT's curve (server predictor and clients' mean): the server's is
    measured; ``local``'s (no server predictor): the clients' mean, named so."""
    both = [{**p, "mean_client_accuracy": 1.0 - p["global_test_accuracy"]} for p in CURVE]
    c = convergence(both, target_accuracy=0.6, link_mbps=8.0)
    assert c is not None and c["accuracy_key"] == "global_test_accuracy"
    assert c["best_accuracy"] == 0.62 and c["rounds_to_target"] == 2
    clients = [
        {**p, "global_test_accuracy": None, "mean_client_accuracy": p["global_test_accuracy"]}
        for p in CURVE
    ]
    c = convergence(clients, target_accuracy=0.6, link_mbps=8.0)
    assert c is not None and c["accuracy_key"] == "mean_client_accuracy"
    assert c["best_accuracy"] == 0.62 and c["rounds_to_target"] == 2
    # a curve with neither accuracy has no convergence
    bare = [{k: v for k, v in p.items() if k != "global_test_accuracy"} for p in CURVE]
    assert convergence(bare, target_accuracy=0.6, link_mbps=8.0) is None
