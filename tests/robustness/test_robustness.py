"""Byzantine robustness: the server's aggregation rules (``server.aggregator``,
:mod:`osfl.fl.aggregators`), the poisons of a robustness experiment
(``byzantine``, :mod:`osfl.robustness.byzantine`) and the member screens of
the methods that keep every client's model (``server.member_filter``).

Rules: Yin et al., ICML 2018 (median, trimmed mean); Blanchard et al.,
NeurIPS 2017 (Krum); Sun et al., 2019 (norm clipping)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import osfl.methods
from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.fl.aggregators import AGGREGATORS, aggregate_states, krum_tolerance
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import Broadcast, Upload
from osfl.robustness.byzantine import POISONS, ByzantineConfig, byzantine_config
from support.smoke import BASE, smoke_config, smoke_context


def states_of(values: list[float], count: int = 7) -> list[dict[str, torch.Tensor]]:
    """One float tensor per client, every coordinate ``value``, plus BatchNorm's counter."""
    return [
        {"w": torch.full((count,), v), "n": torch.tensor(i, dtype=torch.long)}
        for i, v in enumerate(values)
    ]


def combine(values: list[float], rule: str, weights: list[float] | None = None, **knobs: Any):
    states = states_of(values)
    w = weights or [1.0] * len(values)
    return aggregate_states(states, w, ServerConfig(aggregator=rule, **knobs), rule=rule)


# --------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("rule", AGGREGATORS.names())
def test_every_rule_returns_the_common_model_when_clients_agree(rule: str) -> None:
    states = [{"w": torch.linspace(-1, 1, 9), "b": torch.tensor(4, dtype=torch.long)}] * 5
    reference = {"w": torch.zeros(9), "b": torch.tensor(0, dtype=torch.long)}
    out = aggregate_states(states, [3, 1, 2, 5, 1], ServerConfig(), rule=rule, reference=reference)
    assert torch.allclose(out["w"], states[0]["w"], atol=1e-7)
    assert out["b"].dtype == torch.long and int(out["b"]) == 4


@pytest.mark.parametrize("rule", [r for r in AGGREGATORS.names() if r != "mean"])
def test_robust_rules_are_not_moved_by_one_huge_client(rule: str) -> None:
    values = [1.0, 1.1, 0.9, 1.05, 3e38]
    states = states_of(values)
    reference = {"w": torch.zeros(7), "n": torch.tensor(0)}
    out = aggregate_states(
        states, [1] * 5, ServerConfig(clip_norm=2.0), rule=rule, reference=reference
    )
    assert torch.isfinite(out["w"]).all()
    # within the honest clients' range; centered clipping lets each client pull
    # its centre by at most tau / n (here 2 / 5, over all 7 coordinates together)
    slack = 2.0 / 5 if rule == "centered_clip" else 0.0
    assert float(out["w"].max()) <= 1.1 + slack + 1e-6
    mean = combine(values, "mean")["w"]
    assert float(mean.max()) > 1e37  # the plain mean follows the attacker


def test_median_and_trimmed_mean_take_the_middle_values() -> None:
    assert torch.equal(combine([1.0, 2.0, 100.0], "median")["w"], torch.full((7,), 2.0))
    # even count: the mean of the two middle values
    assert torch.equal(combine([1.0, 2.0, 4.0, 100.0], "median")["w"], torch.full((7,), 3.0))
    # trim 0.2 of 5 cuts one value at each end: mean of 1, 2, 3
    out = combine([-1000.0, 1.0, 2.0, 3.0, 1000.0], "trimmed_mean", trim_fraction=0.2)["w"]
    assert torch.allclose(out, torch.full((7,), 2.0))
    # the counter takes the weighted mean, rounded: (0 + 1 + 2) / 3
    assert int(combine([1.0, 2.0, 100.0], "median")["n"]) == 1


def test_krum_picks_a_client_of_the_honest_cluster_and_multi_krum_their_mean() -> None:
    honest = [1.0, 1.2, 0.8, 1.1, 0.9]
    values = [*honest, 50.0]
    krum = combine(values, "krum", byzantine=1)["w"]
    assert float(krum[0]) in honest
    multi = combine(values, "multi_krum", byzantine=1)["w"]  # m = n - f = 5: the honest ones
    assert torch.allclose(multi, torch.full((7,), sum(honest) / 5, dtype=torch.float32))


def test_krum_on_too_few_survivors_caps_f_and_stays_krum(caplog) -> None:
    """4 survivors of 5 (one upload refused) allow f = 0: Krum still picks the
    client closest to its n − 2 nearest others, never switching rule."""
    values = [1.0, 1.1, 0.9, 100.0]
    with caplog.at_level("WARNING"):
        out = combine(values, "krum", byzantine=1)["w"]  # n > 2f + 2 needs n >= 5 for f = 1
    assert "at most f=0" in caplog.text
    assert torch.equal(out, torch.full((7,), 1.0))  # the honest cluster's centre; not a median
    assert torch.equal(out, combine(values, "krum", byzantine=0)["w"])
    multi = combine(values, "multi_krum", byzantine=1)["w"]  # m = n - f = 4 with f capped to 0
    assert torch.allclose(multi, torch.full((7,), sum(values) / 4, dtype=torch.float32))
    assert krum_tolerance(5, 1) == 1 and krum_tolerance(4, 1) == 0 and krum_tolerance(2, 3) == 0


def _authors_clipping(inputs: list[torch.Tensor], tau: float, n_iter: int) -> torch.Tensor:
    """Centered clipping as the authors' code computes it (Karimireddy et al.,
    epfml/byzantine-robust-optimizer, ``codes/aggregator/clipping.py``:
    ``Clipping.__call__`` from a zero momentum), restated here."""
    momentum = torch.zeros_like(inputs[0])
    for _ in range(n_iter):
        clipped = []
        for v in inputs:
            d = v - momentum
            clipped.append(d * min(1.0, tau / float(torch.norm(d))))
        momentum = sum(clipped) / len(inputs) + momentum
    return momentum


def test_centered_clip_equals_the_authors_iteration_and_reaches_its_fixed_point() -> None:
    reference = {"w": torch.zeros(4), "n": torch.tensor(0)}
    values = [1.0, 1.1, 0.9, 1.0, -100.0]
    states = states_of(values, count=4)
    for it in (1, 2, 5):
        rule = ServerConfig(aggregator="centered_clip", clip_norm=2.0, cc_iterations=it)
        got = aggregate_states(states, [1.0] * 5, rule, rule="centered_clip", reference=reference)
        want = _authors_clipping([s["w"].double() for s in states], 2.0, it)
        assert torch.allclose(got["w"].double(), want, atol=1e-6), it
    # to its fixed point: four honest pulls of (1 - v) against one clipped push of
    # tau / |(1, 1, 1, 1)| = 1 per coordinate: 4 (1 - v) = 1, v = 0.75
    rule = ServerConfig(aggregator="centered_clip", clip_norm=2.0)
    fixed = aggregate_states(
        states, [9, 1, 1, 1, 1], rule, rule="centered_clip", reference=reference
    )
    assert torch.allclose(fixed["w"], torch.full((4,), 0.75), atol=1e-5)
    # the poison's size does not matter, only that it is one of five (uniform, as the paper)
    states[-1]["w"] = torch.full((4,), -1e30)
    again = aggregate_states(
        states, [9, 1, 1, 1, 1], rule, rule="centered_clip", reference=reference
    )
    assert torch.allclose(again["w"], fixed["w"], atol=1e-5)
    assert int(fixed["n"]) == round((0 * 9 + 1 + 2 + 3 + 4) / 13)  # integers: weighted mean


def test_norm_clip_bounds_every_update() -> None:
    reference = {"w": torch.zeros(7), "n": torch.tensor(0)}
    states = states_of([0.1, 0.1, 0.1, 100.0])
    rule = ServerConfig(aggregator="norm_clip", clip_norm=1.0)
    out = aggregate_states(states, [1] * 4, rule, rule="norm_clip", reference=reference)
    # the big update is cut to norm 1: (3 * 0.1 + 1/sqrt(7)) / 4 per coordinate
    expected = (3 * 0.1 + 1 / math.sqrt(7)) / 4
    assert torch.allclose(out["w"], torch.full((7,), expected), atol=1e-6)
    assert float(out["w"].norm()) <= 1.0


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"aggregator": "mode"}, "unknown aggregator"),
        ({"trim_fraction": 0.5}, "trim_fraction must lie in"),
        ({"byzantine": -1}, "byzantine must be >= 0"),
        ({"member_filter": "strict"}, "member_filter"),
    ],
)
def test_bad_server_rules_are_refused(knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**knobs)


# --------------------------------------------------------------------------- the poisons
def _honest() -> tuple[Upload, Broadcast]:
    base = {"w": torch.zeros(4), "bn.running_var": torch.ones(4), "bn.running_mean": torch.zeros(4)}
    upload = Upload(
        tensors={
            "w": torch.tensor([1.0, -2.0, 0.5, 0.0]),
            "bn.running_var": torch.full((4,), 2.0),
            "bn.running_mean": torch.full((4,), 0.3),
            "extra": torch.ones(2),
        },
        meta={"num_samples": 10},
    )
    return upload, Broadcast(tensors=base)


def poison(kind: str, scale: float = 10.0) -> tuple[Upload, Upload]:
    honest, broadcast = _honest()
    cfg = ByzantineConfig(clients=[0], kind=kind, scale=scale)
    return honest, POISONS.get(kind)(honest, broadcast, cfg, torch.Generator().manual_seed(0))


def test_sign_flip_reverses_the_update_and_leaves_batchnorm_honest() -> None:
    honest, bad = poison("sign_flip", scale=3.0)
    assert torch.equal(bad.tensors["w"], -3.0 * honest.tensors["w"])
    for k in ("bn.running_var", "bn.running_mean"):
        assert torch.equal(bad.tensors[k], honest.tensors[k])
    assert bad.meta == honest.meta


def test_the_value_poisons_do_what_they_say() -> None:
    _, big = poison("max")
    assert all(bool((t == torch.finfo(t.dtype).max).all()) for t in big.tensors.values())
    _, nan = poison("nan")
    assert all(bool(t.isnan().all()) for t in nan.tensors.values())
    honest, var = poison("bn_var")
    assert bool((var.tensors["bn.running_var"] == -1e6).all())
    assert torch.equal(var.tensors["w"], honest.tensors["w"])
    _, count = poison("num_samples")
    assert count.meta["num_samples"] == 10**18


def test_random_noise_has_the_honest_update_norm() -> None:
    honest, noisy = poison("random")
    _, broadcast = _honest()

    def norm(up: Upload) -> float:
        return math.sqrt(
            sum(
                float(
                    (t.double() - broadcast.tensors.get(k, torch.zeros_like(t)).double())
                    .pow(2)
                    .sum()
                )
                for k, t in up.tensors.items()
            )
        )

    assert norm(noisy) == pytest.approx(norm(honest), rel=1e-5)
    assert not torch.equal(noisy.tensors["w"], honest.tensors["w"])


def test_bad_byzantine_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown poison"):
        ByzantineConfig(clients=[0], kind="flip")
    with pytest.raises(ConfigError, match=r"byzantine\.clients"):
        ByzantineConfig(clients=[-1])
    with pytest.raises(ConfigError, match=r"byzantine\.scale must be a finite number"):
        ByzantineConfig(clients=[0], scale=float("nan"))
    with pytest.raises(ConfigError, match=r"byzantine\.clients must list client ids"):
        byzantine_config({"clients": ["a"]})
    with pytest.raises(ConfigError, match=r"names a client twice"):
        byzantine_config({"clients": [1, 1]})
    with pytest.raises(ConfigError, match=r"\[9\] do not exist: the run has 5 clients"):
        ByzantineConfig(clients=[0, 9]).check_clients(5)


def test_poisoned_clients_are_picked_by_data_size() -> None:
    sizes = [5, 9, 3, 9, 1]
    assert ByzantineConfig(pick="largest", count=2).resolved(sizes).clients == [1, 3]
    assert ByzantineConfig(pick="smallest", count=1).resolved(sizes).clients == [4]
    assert ByzantineConfig(clients=[2]).resolved(sizes).clients == [2]
    with pytest.raises(ConfigError, match="chooses the clients itself"):
        ByzantineConfig(clients=[0], pick="largest")
    with pytest.raises(ConfigError, match="count=6 exceeds the run's 5 clients"):
        ByzantineConfig(pick="smallest", count=6).resolved(sizes)
    with pytest.raises(ConfigError, match=r"byzantine\.pick must be one of"):
        ByzantineConfig(pick="richest")


#: What a fuzzer of the receive path found ends the round; each is one kind now.
CRAFTED = ("nested_meta", "oversize", "garbage", "truncated")


@pytest.mark.parametrize("kind", CRAFTED)
def test_a_crafted_upload_is_that_clients_refusal_and_the_round_goes_on(tmp_path, kind) -> None:
    """``byzantine.kind`` drives each crafted fault through the real round
    loop: client 0 is refused with a reason, the other clients are
    aggregated, and the result equals the run without client 0's upload."""
    base = ["methods=[fedavg]", "partition.num_clients=5", "partition.alpha=10.0"]
    poisoned = _record([*base, "byzantine.clients=[0]", f"byzantine.kind={kind}"], str(tmp_path))
    ((r, c, why),) = [tuple(x) for x in poisoned["refused"]]
    assert (r, c) == (0, 0) and why.startswith("[client 0, field "), why
    missing = _record([*base, "byzantine.clients=[0]", "byzantine.kind=nan"], str(tmp_path))
    assert poisoned["global_test_accuracy"] == missing["global_test_accuracy"]


# --------------------------------------------------------------------------- end to end
def _record(overrides: list[str], cache: str) -> dict[str, Any]:
    cfg = load_config(None, [*BASE, f"cache_dir={cache}", "progress=false", *overrides])
    (record,) = run_experiment(cfg)
    return record


def test_krum_keeps_fedavg_learning_under_a_sign_flipping_client(tmp_path) -> None:
    """1 of 5 clients flips and boosts its update: the mean is dragged to
    chance, Krum keeps an honest client's model (the honest clients train on
    the cache the poisoned run filled: the same local models)."""
    base = [
        "methods=[fedavg]",
        "partition.num_clients=5",
        "partition.alpha=10.0",
        "byzantine.clients=[0]",
        "byzantine.kind=sign_flip",
        "byzantine.scale=20",
    ]
    mean = _record(base, str(tmp_path))
    krum = _record([*base, "server.aggregator=krum"], str(tmp_path))
    assert krum["global_test_accuracy"] > 0.5
    assert krum["global_test_accuracy"] > mean["global_test_accuracy"] + 0.2


@pytest.mark.parametrize(
    ("name", "kind"), [("ensemble", "max"), ("fafi", "max"), ("fafi", "bn_var")]
)
def test_a_poisoned_member_is_refused_and_the_rest_still_predict(name: str, kind: str) -> None:
    """``server.member_filter=finite``: a model whose outputs overflow on the
    server's probe batch (or a negative BatchNorm variance, which FAFI's spec
    refuses outright) does not join; the remaining members predict."""
    cfg = smoke_config(name)
    poisoned = load_config(
        None,
        [
            *BASE,
            *osfl.methods.METHODS.get(name).card.smoke,
            f"methods=[{name}]",
            "byzantine.clients=[0]",
            f"byzantine.kind={kind}",
            "server.member_filter=finite",
        ],
    )
    assert poisoned.partition == cfg.partition
    job = assembly.build_job(poisoned, name, smoke_context(poisoned))
    from osfl.fl.runtime.simulation import SimulationRuntime

    result = SimulationRuntime().execute(job)
    (record,) = result.rounds
    assert list(record.refused) == [0]
    assert record.accepted == [1, 2]
    acc = result.metrics["global_test_accuracy"]
    assert math.isfinite(acc) and acc > 0.2  # chance is 0.1


def _paper_dnc(updates: torch.Tensor, f: int, dims: list[torch.Tensor]) -> set[int]:
    """Divide-and-Conquer as Algorithm 2 of Shejwalkar & Houmansadr (NDSS 2021)
    states it, restated with the coordinate subsets given: the clients among
    the n − f lowest scores of every iteration (an intersection)."""
    good = set(range(updates.shape[0]))
    for r in dims:
        sub = updates[:, r]
        mu = sub.mean(dim=0)
        v = torch.linalg.svd(sub - mu, full_matrices=False)[2][0, :]
        s = torch.tensor([float(torch.dot(u - mu, v)) ** 2 for u in sub])
        good &= set(s.argsort()[: updates.shape[0] - f].tolist())
    return good


def test_dnc_drops_the_client_along_the_top_singular_direction() -> None:
    """Four honest updates near (1, ..., 1) and one pushed far along one
    coordinate: the centred updates' top singular vector points at it, its
    score is the largest, and the honest clients' weighted mean remains."""
    honest = [1.0, 1.2, 0.8, 1.1]
    states = [{"w": torch.full((6,), v), "n": torch.tensor(0)} for v in honest]
    states.append({"w": torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 40.0]), "n": torch.tensor(0)})
    reference = {"w": torch.zeros(6), "n": torch.tensor(0)}
    weights = [1.0, 2.0, 3.0, 4.0, 100.0]
    out = aggregate_states(
        states, weights, ServerConfig(byzantine=1), rule="dnc", reference=reference
    )
    want = sum(w * v for w, v in zip(weights[:4], honest, strict=True)) / sum(weights[:4])
    assert torch.allclose(out["w"], torch.full((6,), want), atol=1e-6)


def test_dnc_scores_are_centred_projections_on_the_top_singular_vector() -> None:
    """Honest updates share a large offset; the attacker moves +5 and −5 on two
    coordinates, which leaves its projection on the offset unchanged. Centred,
    its score is the largest (the paper's line 5); uncentred, the offset is the
    top direction and an honest client would be dropped."""
    from osfl.fl.aggregators import dnc_keep, dnc_scores

    gen = torch.Generator().manual_seed(1)
    updates = 100.0 + 0.1 * torch.randn(5, 6, generator=gen, dtype=torch.float64)
    updates[3, 0] += 5.0
    updates[3, 1] -= 5.0
    got = dnc_scores(updates, slice(None))
    centred = updates - updates.mean(dim=0)
    v = torch.linalg.svd(centred, full_matrices=False)[2][0, :]
    want = torch.tensor([float(torch.dot(u, v)) ** 2 for u in centred], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-10)
    assert int(got.argmax()) == 3 and dnc_keep(updates, 1) == [0, 1, 2, 4]


def test_dnc_select_intersects_the_iterations_and_falls_back_to_the_summed_scores(caplog) -> None:
    from osfl.fl.aggregators import dnc_select

    scores = [torch.tensor([0.0, 1.0, 5.0]), torch.tensor([5.0, 1.0, 0.0])]
    assert dnc_select(scores, 2) == [1]  # {0, 1} ∩ {1, 2}
    assert dnc_select(scores, 1) == [1]  # {0} ∩ {2} is empty: sums 5, 2, 5
    assert dnc_select(scores[:1], 2) == [0, 1]
    # equal scores keep the clients' order, in an iteration and in the fallback
    assert dnc_select([torch.zeros(40)], 10) == list(range(10))
    halves = [
        torch.cat([torch.zeros(20), torch.ones(20)]),
        torch.cat([torch.ones(20), torch.zeros(20)]),
    ]
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert dnc_select(halves, 20) == list(range(20))  # {0..19} ∩ {20..39} is empty
    assert [r.getMessage() for r in caplog.records] == [
        "dnc: no client kept in all 2 iterations; keeping the 20 lowest summed scores"
    ]


def test_dnc_drops_f_clients_and_keeps_one_at_least() -> None:
    from osfl.fl.aggregators import dnc_keep

    gen = torch.Generator().manual_seed(2)
    updates = 0.01 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    updates[1, 0] += 3.0
    updates[4, 2] -= 4.0
    assert dnc_keep(updates, 2) == [0, 2, 3, 5]  # f = 2: both outliers
    assert len(dnc_keep(updates, 6)) == 1  # n − f <= 0 still keeps a client


def test_dnc_draws_its_coordinates_from_a_generator_seeded_with_0() -> None:
    """One iteration on one coordinate of eight, where client j is the outlier
    of coordinate j: the client dropped is the coordinate seed 0 draws."""
    from osfl.fl.aggregators import dnc_keep

    updates = torch.eye(8, dtype=torch.float64) * 10.0
    updates += 0.01 * torch.arange(64, dtype=torch.float64).reshape(8, 8) / 64
    drawn = int(torch.randperm(8, generator=torch.Generator().manual_seed(0))[0])
    other = int(torch.randperm(8, generator=torch.Generator().manual_seed(1))[0])
    assert drawn != other
    kept = dnc_keep(updates, 1, iterations=1, subsample=1)
    assert kept == [j for j in range(8) if j != drawn]


def test_dnc_keeps_only_the_clients_kept_in_every_iteration() -> None:
    """With 3 iterations on 4 random coordinates of 12, the kept set is the
    paper's intersection over the same coordinate draws (a union, as a popular
    re-implementation computes, keeps more)."""
    from osfl.fl.aggregators import dnc_keep

    gen = torch.Generator().manual_seed(3)
    updates = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    updates[2, :6] += 4.0  # one outlier in the first half, another in the second
    updates[4, 6:] += 4.0
    draw = torch.Generator().manual_seed(0)
    dims = [torch.randperm(12, generator=draw)[:4] for _ in range(3)]
    got = dnc_keep(updates, 1, iterations=3, subsample=4)
    assert set(got) == _paper_dnc(updates, 1, dims)
    assert 2 not in got or 4 not in got
    everything = dnc_keep(updates, 1, iterations=1, subsample=100)  # all coordinates
    assert len(everything) == 5
