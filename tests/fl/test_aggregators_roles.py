"""Who plays which role in the robust rules, on inputs no symmetry can hide
(issue 54; the bugs these catch are ``tests/mutation_semantic/aggregators.yaml``).

Every client is recognisable: its own update (a different value, norm and
direction), its own data size, and its own position, and a rule that keeps a
subset (Krum, Multi-Krum, Divide-and-Conquer) drops clients at the first, a
middle and the last position in turn. So a weight paired with another client
after a selection, a reference exchanged with a state, a centre exchanged
with an update, a size a client declares used where the paper counts each
client once, or two counts exchanged, each changes a number the test states.
Every expected value is worked out by hand in the test's docstring or
comments (Blanchard et al., NeurIPS 2017, §4; Yin et al., ICML 2018, Alg. 1;
Sun et al., 2019, §4; Karimireddy et al., ICML 2021, Alg. 2; Shejwalkar &
Houmansadr, NDSS 2021, Alg. 2).
"""

from __future__ import annotations

import math

import pytest
import torch

from osfl.fl.aggregators import aggregate_states, krum_tolerance
from osfl.fl.server_config import ServerConfig

F64 = torch.float64
#: the one direction the Krum clients' updates lie along (three coordinates)
AXIS = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
#: Krum's clients, (update along AXIS, data size): honest ones at distinct
#: points, client 20.0 far away. With n = 7 and f = 1 each score sums the
#: squared distances (times |AXIS|² = 5.25) to the n − f − 2 = 4 nearest
#: others: 0.3 → 0.71, 0.6 → 0.86, 0.1 → 1.11, 0.0 → 1.46, 1.0 → 1.71,
#: 1.5 → 4.46, 20.0 → over 1,000.
KRUM_CLIENTS = {0.0: 2, 0.1: 7, 0.3: 1, 0.6: 8, 1.0: 3, 1.5: 5, 20.0: 4}
#: the same seven clients in three orders: the far one first, in the middle, last
LAYOUTS = {
    "far-first": [20.0, 1.5, 0.0, 0.6, 0.1, 1.0, 0.3],
    "far-middle": [0.3, 1.0, 0.0, 20.0, 1.5, 0.6, 0.1],
    "far-last": [0.1, 0.6, 1.5, 0.3, 1.0, 0.0, 20.0],
}


def _reference() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([10.0, -10.0, 5.0], dtype=F64), "n": torch.tensor(0)}


def _krum_states(order: list[float]) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    ref = _reference()
    states = [{"w": ref["w"] + v * AXIS, "n": torch.tensor(int(10 * v))} for v in order]
    return states, [float(KRUM_CLIENTS[v]) for v in order]


def _weighted(values: dict[float, int]) -> float:
    return sum(v * w for v, w in values.items()) / sum(values.values())


def _rule(rule: str, states, weights, **knobs) -> dict[str, torch.Tensor]:
    params = ServerConfig(aggregator=rule, **knobs)
    return aggregate_states(states, weights, params, rule=rule, reference=_reference())


def _along_axis(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["w"] - _reference()["w"]


# --------------------------------------------------------------------------- Krum, Multi-Krum
@pytest.mark.parametrize("layout", LAYOUTS)
def test_krum_keeps_the_client_closest_to_its_n_minus_f_minus_2_nearest_others(layout) -> None:
    """0.3 has the lowest score (0.04 + 0.09 + 0.09 + 0.49 = 0.71 along the
    axis), wherever it and the far client sit."""
    states, weights = _krum_states(LAYOUTS[layout])
    out = _rule("krum", states, weights, byzantine=1)
    assert torch.allclose(_along_axis(out), 0.3 * AXIS, rtol=0, atol=1e-12)
    assert int(out["n"]) == 3  # Krum keeps one state: its own counter


@pytest.mark.parametrize("layout", LAYOUTS)
def test_multi_krum_averages_the_kept_clients_with_their_own_data_sizes(layout) -> None:
    """m = n − f = 6 drops the far client, at its position in each layout: the
    six honest updates weighted by their own sizes, 16.3 / 26 along the axis
    (a weight taken by rank instead would pair a kept state with the far
    client's size whenever it is not last)."""
    states, weights = _krum_states(LAYOUTS[layout])
    out = _rule("multi_krum", states, weights, byzantine=1)
    honest = {v: w for v, w in KRUM_CLIENTS.items() if v != 20.0}
    assert _weighted(honest) == pytest.approx(16.3 / 26, abs=1e-15)
    assert torch.allclose(_along_axis(out), (16.3 / 26) * AXIS, rtol=0, atol=1e-12)
    # the integer buffer: the same kept clients' weighted mean, rounded
    assert int(out["n"]) == round(sum(10 * v * w for v, w in honest.items()) / 26)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_multi_krum_scores_with_f_and_keeps_m(layout) -> None:
    """f = 1 and m = 3: the three lowest scores (0.3, 0.6, 0.1) averaged with
    their sizes 1, 8, 7: (0.3 + 4.8 + 0.7) / 16 = 0.3625. With the two counts
    exchanged (f = 3, m = 1: two nearest others, one client) the result is
    0.1 alone; scoring with the zero self-distance counted keeps 0.3, 0.1 and
    0.0 instead."""
    states, weights = _krum_states(LAYOUTS[layout])
    out = _rule("multi_krum", states, weights, byzantine=1, krum_select=3)
    assert torch.allclose(_along_axis(out), 0.3625 * AXIS, rtol=0, atol=1e-12)


def test_multi_krum_weights_follow_the_client_ids_not_the_arrival_order() -> None:
    """The same kept set through ``clients``: the states arrive in another
    order than their ids, and every weight must follow its own client when the
    rule sorts them (ids 40, 10, 30, 20, 60, 50, 0 for the far-middle layout)."""
    states, weights = _krum_states(LAYOUTS["far-middle"])
    ids = [40, 10, 30, 20, 60, 50, 0]
    params = ServerConfig(aggregator="multi_krum", byzantine=1, krum_select=3)
    out = aggregate_states(
        states, weights, params, rule="multi_krum", reference=_reference(), clients=ids
    )
    assert torch.allclose(_along_axis(out), 0.3625 * AXIS, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("n", "most"), [(3, 0), (4, 0), (5, 1), (6, 1), (7, 2), (8, 2), (9, 3)])
def test_krum_tolerance_keeps_n_greater_than_2f_plus_2(n: int, most: int) -> None:
    """The largest f with n > 2f + 2 (Blanchard et al., Prop. 1): for an even
    n, n = 2f + 2 is not enough (6 uploads tolerate 1, not 2)."""
    assert krum_tolerance(n, n) == most
    assert n > 2 * most + 2 and not n > 2 * (most + 1) + 2


# --------------------------------------------------------------------------- median, trimmed mean
#: five clients, three coordinates; the extremes of each coordinate sit at
#: other clients (coordinate 0: clients 1 and 3; 1: clients 0 and 2; 2: 0 and 4)
TRIM_ROWS = [
    [5.0, -50.0, 8.0],
    [-100.0, 4.0, 9.0],
    [2.0, 60.0, 10.0],
    [100.0, 1.0, 11.0],
    [3.0, 7.0, 12.0],
]


def _rows(rows: list[list[float]]) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(r, dtype=F64)} for r in rows]


def test_trimmed_mean_cuts_each_coordinates_extremes_wherever_they_are() -> None:
    """β = 0.2 of 5 cuts one value at each end, per coordinate, by value:
    coordinate 0 keeps 2, 3, 5 (10/3); 1 keeps 1, 4, 7 (4); 2 keeps 9, 10, 11
    (10). The sizes the clients declare do not enter (Yin et al., Alg. 1):
    client 1 claims 1000 samples, and its −100 is cut all the same."""
    out = aggregate_states(
        _rows(TRIM_ROWS),
        [1.0, 1000.0, 2.0, 3.0, 4.0],
        ServerConfig(aggregator="trimmed_mean", trim_fraction=0.2),
        rule="trimmed_mean",
    )
    assert torch.allclose(
        out["w"], torch.tensor([10 / 3, 4.0, 10.0], dtype=F64), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        # n = 4, β = 0.45: ⌈1.8⌉ = 2 is capped to (n − 1) // 2 = 1, the two middle values
        ([[7.0], [-3.0], [40.0], [1.0]], 4.0),
        # n = 6, β = 0.45: ⌈2.7⌉ = 3 capped to 2: the middle two of −9, 0, 2, 6, 8, 30
        ([[8.0], [-9.0], [2.0], [30.0], [0.0], [6.0]], 4.0),
    ],
)
def test_trimmed_mean_always_keeps_a_middle(rows, want) -> None:
    out = aggregate_states(
        _rows(rows),
        [1.0] * len(rows),
        ServerConfig(aggregator="trimmed_mean", trim_fraction=0.45),
        rule="trimmed_mean",
    )
    assert float(out["w"]) == pytest.approx(want, abs=1e-12)


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values() -> None:
    """Six clients: −2, 1, 4, 6, 9, 100 in another order: (4 + 6) / 2 = 5,
    however large a size the far client declares."""
    rows = [[6.0], [-2.0], [9.0], [1.0], [4.0], [100.0]]
    for weights in ([1.0] * 6, [1.0, 2.0, 3.0, 4.0, 5.0, 1e6]):
        out = aggregate_states(
            _rows(rows), weights, ServerConfig(aggregator="median"), rule="median"
        )
        assert float(out["w"]) == 5.0


# --------------------------------------------------------------------------- norm clipping
#: four updates around the reference, of norms 0.5, 5, 2 and 0.8, sizes 1, 2, 3, 4
CLIP_UPDATES = [(0.3, 0.0, 0.4), (0.0, 3.0, 4.0), (-2.0, 0.0, 0.0), (0.0, -0.48, 0.64)]


def _clip_states() -> list[dict[str, torch.Tensor]]:
    ref = _reference()
    return [
        {"w": ref["w"] + torch.tensor(u, dtype=F64), "n": torch.tensor(0)} for u in CLIP_UPDATES
    ]


def test_norm_clip_scales_each_update_about_the_reference_and_never_up() -> None:
    """τ = 1: the updates of norm 5 and 2 are scaled by 0.2 and 0.5, those of
    norm 0.5 and 0.8 kept as they are (min(1, τ/‖Δ‖), never scaled up); the
    clipped updates (0.3, 0, 0.4), (0, 0.6, 0.8), (−1, 0, 0), (0, −0.48, 0.64)
    weighted 1, 2, 3, 4: (−0.27, −0.072, 0.456), added to the reference
    (10, −10, 5), not to any client's state."""
    out = _rule("norm_clip", _clip_states(), [1.0, 2.0, 3.0, 4.0], clip_norm=1.0)
    want = torch.tensor([10 - 0.27, -10 - 0.072, 5 + 0.456], dtype=F64)
    assert torch.allclose(out["w"], want, rtol=0, atol=1e-12)


def test_norm_clip_leaves_updates_within_tau_untouched() -> None:
    """τ = 10 is above every update's norm: the plain weighted mean of the
    states, (0.3·1 − 2·3, 3·2 − 0.48·4, 0.4 + 4·2 + 0.64·4) / 10 from the
    reference."""
    out = _rule("norm_clip", _clip_states(), [1.0, 2.0, 3.0, 4.0], clip_norm=10.0)
    want = torch.tensor([10 - 0.57, -10 + 0.408, 5 + 1.096], dtype=F64)
    assert torch.allclose(out["w"], want, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- centered clipping
#: four updates of norms 0.5, 5, 2 and 0.25 around a reference (2, −1)
CC_UPDATES = [(0.3, 0.4), (3.0, 4.0), (-2.0, 0.0), (0.0, 0.25)]
CC_REFERENCE = {"w": torch.tensor([2.0, -1.0], dtype=F64)}


def _cc(weights: list[float], iterations: int) -> torch.Tensor:
    states = [{"w": CC_REFERENCE["w"] + torch.tensor(u, dtype=F64)} for u in CC_UPDATES]
    params = ServerConfig(aggregator="centered_clip", clip_norm=1.0, cc_iterations=iterations)
    out = aggregate_states(states, weights, params, rule="centered_clip", reference=CC_REFERENCE)
    return out["w"]


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 1000.0, 1.0]])
def test_centered_clip_first_step_moves_the_centre_toward_each_client_by_at_most_tau_over_n(
    weights,
) -> None:
    """One iteration from the broadcast (v₀ = 0): the differences x_i − v₀
    clipped to τ = 1 are (0.3, 0.4), (0.6, 0.8), (−1, 0), (0, 0.25); their
    mean, each client counting 1/n whatever size it declares (the client of
    (−2, 0) claims 1000 samples here), is (−0.025, 0.3625), added to the
    reference (2, −1)."""
    got = _cc(weights, 1)
    assert torch.allclose(got, torch.tensor([1.975, -0.6375], dtype=F64), rtol=0, atol=1e-12)


def test_centered_clip_second_step_starts_from_the_first() -> None:
    """Two iterations: from v₁ = (−0.025, 0.3625) the differences are
    (0.325, 0.0375) and (0.025, −0.1125), within τ, and (3.025, 3.6375),
    (−1.975, −0.3625), clipped to norm 1; v₂ = v₁ + their mean."""
    v1 = torch.tensor([-0.025, 0.3625], dtype=F64)
    diffs = [torch.tensor(u, dtype=F64) - v1 for u in CC_UPDATES]
    clipped = [d * min(1.0, 1.0 / math.hypot(*d.tolist())) for d in diffs]
    assert [round(math.hypot(*d.tolist()), 4) for d in diffs] == [0.3272, 4.731, 2.008, 0.1152]
    v2 = v1 + sum(clipped) / 4
    assert torch.allclose(_cc([1.0, 1.0, 1.0, 1.0], 2), CC_REFERENCE["w"] + v2, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- Divide-and-Conquer
#: five honest updates that share a direction (about 10 along the first
#: coordinate, as clients trained from one broadcast do) and a free rider
#: that sends no update at all: the centred updates' top singular vector is
#: (about) the first axis and the free rider's centred projection, −8.3, is
#: the largest in size; its raw projection (0) is the smallest.
DNC_HONEST = {
    (10.0, 0.3): 3.0,
    (10.2, -0.1): 1.0,
    (9.9, 0.2): 4.0,
    (10.1, -0.3): 2.0,
    (9.8, -0.1): 6.0,
}
DNC_FREE_RIDER = ((0.0, 0.0), 5.0)


@pytest.mark.parametrize("position", [0, 2, 5])
def test_dnc_drops_the_outlier_and_weighs_each_kept_client_by_its_own_size(position: int) -> None:
    """f = 1: the free rider is dropped wherever it sits (first, third, last),
    and the five honest updates are averaged with their own sizes 3, 1, 4, 2,
    6: (158.8, 0.4) / 16 = (9.925, 0.025)."""
    clients = list(DNC_HONEST.items())
    clients.insert(position, DNC_FREE_RIDER)
    ref = _reference()["w"][:2]
    states = [{"w": ref + torch.tensor(u, dtype=F64)} for u, _ in clients]
    weights = [w for _, w in clients]
    params = ServerConfig(aggregator="dnc", byzantine=1)
    out = aggregate_states(states, weights, params, rule="dnc", reference={"w": ref}, seed=7)
    assert torch.allclose(
        out["w"] - ref, torch.tensor([9.925, 0.025], dtype=F64), rtol=0, atol=1e-12
    )
