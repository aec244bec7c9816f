"""The robust rules at their edges: one surviving upload, client ids that
decide a tie, the default draw, the round's draw seed (mutants of
``osfl.fl.aggregators`` that the round-three mutmut run left alive: TESTING.md)."""

from __future__ import annotations

import math

import pytest
import torch

from osfl.fl.aggregators import AGGREGATORS, aggregate_states, dnc_draws, draw_seed
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
