"""The robust rules' edge cases, exactly (tests that mutation testing showed
were missing: TESTING.md). The rules themselves are compared with Flower's in
tests/flower/test_reference.py and their robustness in tests/robustness/test_robustness.py."""

from __future__ import annotations

import logging

import pytest
import torch

from osfl.fl.aggregators import aggregate_states, krum_scores, krum_tolerance
from osfl.fl.server_config import ServerConfig


def test_integer_buffers_before_float_tensors_do_not_end_the_per_coordinate_rules() -> None:
    """A state whose first entry is an integer buffer (BatchNorm's
    ``num_batches_tracked`` sorts first in some models): every float tensor
    after it is still combined by the rule."""
    states = [
        {"n": torch.tensor(v, dtype=torch.long), "w": torch.tensor([float(v), -float(v)])}
        for v in (1, 2, 30)
    ]
    out = aggregate_states(states, [1, 1, 1], ServerConfig(aggregator="median"), rule="median")
    assert torch.equal(out["w"], torch.tensor([2.0, -2.0]))
    assert int(out["n"]) == 11  # the integer buffer: the weighted mean, (1 + 2 + 30) / 3


def test_median_of_half_precision_states_is_computed_in_float64() -> None:
    """torch's quantile refuses bfloat16 and float16, so the rule lifts every
    coordinate to float64 and rounds the median back once."""
    g = torch.Generator().manual_seed(0)
    stack = (torch.randn(4, 50, generator=g) * 3).to(torch.bfloat16)
    states = [{"w": row} for row in stack]
    out = aggregate_states(states, [1] * 4, ServerConfig(aggregator="median"), rule="median")
    want = stack.to(torch.float64).quantile(0.5, dim=0).to(torch.bfloat16)
    assert out["w"].dtype == torch.bfloat16 and torch.equal(out["w"], want)


def test_krum_scores_sum_the_squared_distances_to_the_nearest_others() -> None:
    """n = 4 points on a line at 0, 1, 3, 7. f = 0: each point's two nearest
    others (n − f − 2 = 2); f = 1: its one nearest."""
    u = torch.tensor([[0.0], [1.0], [3.0], [7.0]], dtype=torch.float64)
    assert krum_scores(u, 0).tolist() == [1 + 9, 1 + 4, 4 + 9, 16 + 36]
    assert krum_scores(u, 1).tolist() == [1, 1, 4, 16]


def test_krum_tolerance_warns_only_when_it_caps_f(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="osfl.fl.aggregators"):
        assert krum_tolerance(5, 1) == 1  # n > 2f + 2 holds: no warning
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="osfl.fl.aggregators"):
        assert krum_tolerance(5, 2) == 1
    assert (
        "krum: 5 upload(s) in the round allow at most f=1 Byzantine (n > 2f + 2); "
        "scoring with f=1 instead of server.byzantine=2" in caplog.text
    )


def test_krum_keeps_the_first_client_among_equal_scores_and_logs_its_choice(caplog) -> None:
    """40 one-hot updates: every pairwise squared distance is 2, so every score
    ties; the stable sort keeps position 0 (an unstable one need not)."""
    states = [{"w": torch.eye(40)[i]} for i in range(40)]
    with caplog.at_level(logging.DEBUG, logger="osfl.fl.aggregators"):
        out = aggregate_states(states, [1] * 40, ServerConfig(aggregator="krum"), rule="krum")
    assert torch.equal(out["w"], torch.eye(40)[0])
    assert [r.getMessage() for r in caplog.records] == ["krum: kept clients at positions [0] of 40"]


def test_krum_over_states_without_float_tensors_keeps_their_mean() -> None:
    """Nothing to score (no float tensor): every score is 0, the first client is
    kept."""
    states = [{"n": torch.tensor(v, dtype=torch.long)} for v in (4, 8, 12, 16, 20)]
    out = aggregate_states(states, [1] * 5, ServerConfig(aggregator="krum"), rule="krum")
    assert int(out["n"]) == 4


def test_krum_of_half_precision_states_without_a_reference() -> None:
    """bfloat16 uploads and no reference model: the updates are lifted to
    float64 (torch has no bfloat16 cdist). With the default f = 1 a score sums
    the n − f − 2 = 2 nearest others: 1004 (16 + 16) beats 1000 and 1008 (80)."""
    vals = [1000.0, 1004.0, 1008.0, 2000.0, 3000.0]
    states = [{"w": torch.tensor([v], dtype=torch.bfloat16)} for v in vals]
    out = aggregate_states(states, [1] * 5, ServerConfig(aggregator="krum"), rule="krum")
    assert out["w"].dtype == torch.bfloat16 and float(out["w"]) == 1004.0


def test_the_default_rule_is_the_weighted_mean_and_no_state_is_refused() -> None:
    states = [{"w": torch.tensor([0.0, 4.0])}, {"w": torch.tensor([8.0, 0.0])}]
    out = aggregate_states(states, [3, 1], ServerConfig())
    assert torch.equal(out["w"], torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match=r"^aggregate_states needs at least one state$"):
        aggregate_states([], [], ServerConfig())
