"""osfl's aggregation rules against Flower's own functions on the same inputs
(flwr 1.41: ``flwr/server/strategy/aggregate.py`` — ``aggregate``,
``aggregate_median``, ``aggregate_trimmed_avg``, ``aggregate_krum`` — and
``flwr/supercore/differential_privacy.py::compute_clip_model_update``; flwr
is a dependency, so the reference is called, not copied).

Inputs are float64 so that the two sides may differ only by summation order
(tolerance 1e-12). Where the conventions differ it is said and tested:
the trimmed mean cuts ``int(p·n)`` values per end in Flower and
``ceil(p·n)`` in osfl (at least one for any p > 0), so they agree where
``p·n`` is an integer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import (
    aggregate,
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)
from flwr.supercore.differential_privacy import compute_clip_model_update

from osfl.fl.aggregators import aggregate_states, weighted_mean
from osfl.fl.server_config import ServerConfig

SHAPES = {"conv.weight": (4, 3, 2, 2), "fc.bias": (5,)}


def clients(n: int, seed: int, spread: float = 1.0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return [
        {k: torch.from_numpy(rng.normal(0, spread, s)) for k, s in SHAPES.items()} for _ in range(n)
    ]


def flower_results(states, counts) -> list[tuple[list[np.ndarray], int]]:
    return [([s[k].numpy() for k in SHAPES], int(c)) for s, c in zip(states, counts, strict=True)]


def assert_same(osfl_state: dict[str, torch.Tensor], flower: list[np.ndarray]) -> None:
    for (k, _), ref in zip(SHAPES.items(), flower, strict=True):
        np.testing.assert_allclose(osfl_state[k].numpy(), ref, rtol=0, atol=1e-12, err_msg=k)


def rule(name: str, states, counts, reference=None, **knobs) -> dict[str, torch.Tensor]:
    params = ServerConfig(aggregator=name, **knobs)
    return aggregate_states(states, counts, params, rule=name, reference=reference)


@pytest.mark.parametrize("seed", range(3))
def test_the_mean_is_flowers_weighted_average(seed: int) -> None:
    states, counts = clients(6, seed), [12, 7, 30, 1, 5, 9]
    assert_same(weighted_mean(states, counts), aggregate(flower_results(states, counts)))
    assert_same(rule("mean", states, counts), aggregate(flower_results(states, counts)))


@pytest.mark.parametrize(("n", "seed"), [(5, 0), (6, 1), (7, 2)])
def test_the_median_is_flowers(n: int, seed: int) -> None:
    """Odd and even counts (the mean of the two middle values, as np.median)."""
    states = clients(n, seed)
    assert_same(rule("median", states, [1] * n), aggregate_median(flower_results(states, [1] * n)))


@pytest.mark.parametrize(("n", "fraction"), [(10, 0.1), (10, 0.2), (5, 0.2), (8, 0.25)])
def test_the_trimmed_mean_is_flowers_where_the_cut_is_whole(n: int, fraction: float) -> None:
    states = clients(n, n)
    want = aggregate_trimmed_avg(flower_results(states, [1] * n), fraction)
    assert_same(rule("trimmed_mean", states, [1] * n, trim_fraction=fraction), want)


def test_the_trimmed_mean_cuts_up_where_flower_cuts_down() -> None:
    """p·n = 0.5: Flower cuts nothing (its plain mean), osfl one value per end."""
    states = clients(5, 7)
    flower = aggregate_trimmed_avg(flower_results(states, [1] * 5), 0.1)
    assert_same(rule("mean", states, [1] * 5), flower)
    assert_same(
        rule("trimmed_mean", states, [1] * 5, trim_fraction=0.2),
        aggregate_trimmed_avg(flower_results(states, [1] * 5), 0.2),
    )
    ours = rule("trimmed_mean", states, [1] * 5, trim_fraction=0.1)
    assert not torch.allclose(ours["fc.bias"], torch.from_numpy(flower[1]))


@pytest.mark.parametrize(("n", "f"), [(7, 1), (7, 2), (9, 3), (5, 1)])
def test_krum_picks_flowers_client(n: int, f: int) -> None:
    """Krum is translation invariant: osfl scores updates against the
    broadcast, Flower the weights themselves; they pick the same client."""
    states = clients(n - 1, n, spread=0.1) + clients(1, 99, spread=5.0)  # one far client
    reference = {k: torch.zeros(s, dtype=torch.float64) for k, s in SHAPES.items()}
    counts = list(range(1, n + 1))
    want = aggregate_krum(flower_results(states, counts), num_malicious=f, to_keep=0)
    assert_same(rule("krum", states, counts, reference=reference, byzantine=f), want)


@pytest.mark.parametrize(("n", "f", "m"), [(7, 1, 4), (9, 2, 5)])
def test_multi_krum_averages_flowers_selection(n: int, f: int, m: int) -> None:
    states = clients(n, 2 * n, spread=0.3)
    counts = [3, 1, 4, 1, 5, 9, 2, 6, 5][:n]
    want = aggregate_krum(flower_results(states, counts), num_malicious=f, to_keep=m)
    got = rule("multi_krum", states, counts, byzantine=f, krum_select=m)
    assert_same(got, want)


@pytest.mark.parametrize("tau", [0.5, 2.0, 50.0])
def test_norm_clipping_is_flowers_clip_then_the_weighted_mean(tau: float) -> None:
    """Each update (state − broadcast) clipped to L2 norm tau over all its
    tensors (Flower's ``compute_clip_model_update``), then the weighted mean."""
    reference = clients(1, 5)[0]
    states = clients(4, 6, spread=2.0)
    counts = [4, 1, 2, 3]
    clipped = []
    for s in states:
        params = [s[k].numpy().copy() for k in SHAPES]
        compute_clip_model_update(params, [reference[k].numpy() for k in SHAPES], tau)
        clipped.append(params)
    want = aggregate(list(zip(clipped, counts, strict=True)))
    assert_same(rule("norm_clip", states, counts, reference=reference, clip_norm=tau), want)
