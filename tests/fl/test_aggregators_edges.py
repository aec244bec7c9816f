"""The robust rules at their edges: one surviving upload, client ids that
decide a tie, the default draw, the round's draw seed; and the weighted mean
under them: sizes in float32, sizes without a finite positive total, a size
count that is not the state count, counters past float32's integers (mutants
of ``osfl.fl.aggregators`` that the round-three mutmut runs left alive, the
last four tests for its re-run under the forkserver isolation: TESTING.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from osfl.fl.aggregators import (
    AGGREGATORS,
    aggregate_states,
    dnc_draws,
    draw_seed,
    weighted_mean,
)
from osfl.fl.seeds import derive_seed
from osfl.fl.server_config import ServerConfig

F64 = torch.float64


@pytest.mark.parametrize("rule", AGGREGATORS.names())
def test_every_rule_returns_the_one_upload_a_round_kept(rule: str) -> None:
    """A round whose other uploads were all refused (``min_clients`` = 1) hands
    the rule one state: every rule returns it (Krum with f capped to 0, DnC
    keeping its one client, the clipping rules with τ its own norm)."""
    reference = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=F64), "n": torch.tensor(3)}
    state = {"w": torch.tensor([4.0, 2.0, -1.5], dtype=F64), "n": torch.tensor(7)}
    out = aggregate_states(
        [state], [5.0], ServerConfig(aggregator=rule), rule=rule, reference=reference
    )
    assert torch.allclose(out["w"], state["w"], rtol=0, atol=1e-12)
    assert out["n"].dtype == torch.long and int(out["n"]) == 7


def test_a_krum_tie_goes_to_the_lowest_client_id_wherever_it_arrives() -> None:
    """Five one-hot updates: every pairwise distance is √2, every Krum score
    ties, and the rule keeps the state of the lowest id (1, the fourth to
    arrive), not the first to arrive."""
    ids = [5, 2, 8, 1, 6]
    states = [{"w": torch.eye(5, dtype=F64)[i]} for i in range(5)]
    params = ServerConfig(aggregator="krum", byzantine=1)
    out = aggregate_states(states, [1.0] * 5, params, rule="krum", clients=ids)
    assert torch.equal(out["w"], torch.eye(5, dtype=F64)[3])


@pytest.mark.parametrize(
    "ids", [[0, 1, 1], [0, 1], [0, 1, 2, 3]], ids=["repeated", "too-few", "too-many"]
)
def test_the_client_ids_are_one_distinct_id_per_state(ids: list[int]) -> None:
    states = [{"w": torch.tensor([float(i)])} for i in range(3)]
    with pytest.raises(
        ValueError, match=r"^aggregate_states needs one distinct client id per state$"
    ):
        aggregate_states(states, [1.0] * 3, ServerConfig(), clients=ids)


def test_the_round_draw_seed_is_the_run_seed_round_and_secret_under_its_own_label() -> None:
    """The server's draw is seeded from the run seed, the round and (on real
    sites) its secret, under the label ``server-draw``, so it is no other
    seed derived from the same run seed and round; the recorded DnC runs in
    ``reproduction/`` drew from exactly these seeds."""
    for run_seed, rnd, secret in [(0, 0, None), (3, 7, None), (0, 2, "ab" * 32)]:
        assert draw_seed(run_seed, rnd, secret) == derive_seed("server-draw", run_seed, rnd, secret)
    assert draw_seed(0, 0) != derive_seed(0, 0, None)
    assert len({draw_seed(s, 1) for s in range(4)}) == 4  # each run seed its own draws


def test_without_a_seed_dnc_draws_from_seed_0() -> None:
    """30,000 coordinates, drawn 10,000 at a time: client 4 adds +50 to the
    ~4,000 coordinates none of seed 0's five draws looks at, and client 2's
    update is three times the others'. A DnC called without a seed draws as
    seed 0 does, cannot see the poison, drops client 2 and keeps client 4
    (one of the four kept, it reaches the model as 50/4 on those
    coordinates); seed 1's draws see it and drop client 4."""
    d = 30_000
    assert all(torch.equal(a, b) for a, b in zip(dnc_draws(d), dnc_draws(d, seed=0), strict=True))
    seen = torch.zeros(d, dtype=torch.bool)
    for dims in dnc_draws(d, seed=0):
        seen[dims] = True
    hidden = (~seen).nonzero().flatten()
    assert 3_000 < len(hidden) < 5_000  # (2/3)^5 of the coordinates
    gen = torch.Generator().manual_seed(4)
    updates = 0.1 * torch.randn(5, d, generator=gen, dtype=F64)
    updates[2] *= 3.0  # an honest client unlike the others: the one seed 0 drops
    updates[4, hidden] += 50.0
    states = [{"w": u} for u in updates]
    params = ServerConfig(aggregator="dnc", byzantine=1)
    default = aggregate_states(states, [1.0] * 5, params, rule="dnc")["w"]
    seeded = aggregate_states(states, [1.0] * 5, params, rule="dnc", seed=0)["w"]
    other = aggregate_states(states, [1.0] * 5, params, rule="dnc", seed=1)["w"]
    assert torch.equal(default, seeded)
    assert math.isclose(float(default[hidden].mean()), 50 / 4, rel_tol=0.05)
    assert abs(float(other[hidden].mean())) < 0.5


@pytest.mark.parametrize("rule", ["mean", "multi_krum", "dnc"])
def test_float32_sizes_are_normalised_in_float64(rule: str) -> None:
    """Sizes handed over as float32 (a NumPy or torch count array) are
    normalised in float64, as the module promises: 1 and 2 of 3 weigh exactly
    1/3 and 2/3 to float64's precision, so the states 3 and 0 average to 1.0
    exactly; normalised in float32, 1/3 becomes 0.33333334 and the mean
    1.0000000298. Multi-Krum and DnC (n = 2, f = 0) keep both clients and
    weigh them the same way."""
    states = [{"w": torch.tensor([3.0], dtype=F64)}, {"w": torch.tensor([0.0], dtype=F64)}]
    sizes = np.array([1.0, 2.0], dtype=np.float32)
    assert float(weighted_mean(states, sizes)["w"]) == 1.0
    params = ServerConfig(aggregator=rule, byzantine=0)
    out = aggregate_states(states, sizes, params, rule=rule)
    assert float(out["w"]) == 1.0


@pytest.mark.parametrize(
    "sizes",
    [[0.0, 0.0, 0.0], [1.0, math.inf, 2.0], [-1.0, -2.0, -3.0]],
    ids=["all-zero", "infinite", "negative"],
)
def test_sizes_without_a_finite_positive_total_weigh_every_client_the_same(sizes) -> None:
    """Sizes that sum to 0, to infinity or below 0 cannot be normalised: every
    client counts 1/n, so the states 1, 4 and 10 average to 5. Divided by
    their total instead, the first two give NaN and the third 6.5
    ((1 + 8 + 30) / 6), a wrong mean that looks valid."""
    states = [{"w": torch.tensor([v], dtype=F64)} for v in (1.0, 4.0, 10.0)]
    assert float(weighted_mean(states, sizes)["w"]) == pytest.approx(5.0, abs=1e-12)
    out = aggregate_states(states, sizes, ServerConfig(aggregator="mean"))
    assert float(out["w"]) == pytest.approx(5.0, abs=1e-12)


def test_weighted_mean_refuses_no_state_and_a_size_count_that_is_not_the_state_count() -> None:
    """No state has no mean; and two sizes for three states would drop a
    client's state from the mean without a word (or weigh each state with
    another client's size), so the sizes are paired strictly."""
    with pytest.raises(ValueError, match=r"^weighted_mean needs at least one state$"):
        weighted_mean([], [])
    states = [{"w": torch.tensor([float(v)], dtype=F64)} for v in (1, 2, 3)]
    for sizes in ([1.0, 1.0], [1.0, 1.0, 1.0, 1.0]):
        with pytest.raises(ValueError, match=r"zip\(\) argument 2 is (shorter|longer)"):
            weighted_mean(states, sizes)


def test_weighted_mean_multiplies_in_float64_whatever_the_states_dtype() -> None:
    """Each state is lifted to float64 before it is weighed: a step counter of
    2²⁴ + 1 (past float32's integers) held by two equal clients averages to
    itself, where 0.5 · (2²⁴ + 1) taken in float32 rounds to 2²³ and the mean
    to 2²⁴; and ten float32 copies of one model, each weighing 1/10, return
    it bit for bit."""
    big = 2**24 + 1
    counters = [{"n": torch.tensor(big)}, {"n": torch.tensor(big)}]
    out = weighted_mean(counters, [1.0, 1.0])
    assert out["n"].dtype == torch.long and int(out["n"]) == big
    model = torch.randn(1_000, generator=torch.Generator().manual_seed(0))
    out = weighted_mean([{"w": model.clone()} for _ in range(10)], [1.0] * 10)
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"], model)
