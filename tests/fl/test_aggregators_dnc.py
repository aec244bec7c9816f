"""Divide-and-Conquer's draw (issue 55): it re-runs, it is drawn afresh each
round, and no client can plan around it.

A simulated round re-runs to the same model (the draw is a function of the
run seed and the round, never of the order a decoded upload's dict holds its
tensors in); each round draws other coordinates, so a poison hidden in the
coordinates one round does not look at is seen, and dropped, in the rounds
after; and on real sites the draw also depends on the server's own secret,
which no broadcast carries (tested over Flower in
``tests/fl/test_order_free_sites.py``), so even round 0's draw cannot
be planned around.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from osfl.fl.aggregators import (
    DNC_SUBSAMPLE,
    _updates,
    aggregate_states,
    dnc_draws,
    dnc_keep,
    draw_seed,
)
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.server_config import ServerConfig
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import Upload
from osfl.methods.clients import combine_states

RUN_SEED = 0
#: about 24,000 float coordinates in 30 tensors, as many as the default
#: task's cnn_small (24,282): more than DnC's 10,000 a draw
SHAPES = {f"layer{i:02d}.weight": (8, 100) for i in range(30)}


def _reference() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}


def _run(secret: str | None = None) -> RunContext:
    """A server's RunContext with DnC (f = 1), as the methods read it."""
    return RunContext(
        num_classes=10,
        image_shape=(1, 8, 8),
        num_clients=5,
        model=ModelSpec("cnn_small"),
        train=TrainConfig(),
        train_transform=None,
        eval_transform=None,
        seed=RUN_SEED,
        server=ServerConfig(aggregator="dnc", byzantine=1),
        server_secret=secret,
    )


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].flatten() for k in sorted(SHAPES)])


def _honest_states(n: int = 5) -> list[dict[str, torch.Tensor]]:
    """Five clients' states around the reference: small non-IID updates, and
    client 2's three times as large (an honest client unlike the others)."""
    gen = torch.Generator().manual_seed(2)
    ref = _reference()
    states = []
    for c in range(n):
        scale = 0.3 if c == 2 else 0.1
        states.append({k: v + torch.randn(v.shape, generator=gen) * scale for k, v in ref.items()})
    return states


def _decoded(states: list[dict[str, torch.Tensor]], rng: random.Random) -> list[dict]:
    """Each state through the real upload encoding, decoded, its keys then
    held in a random order (as a hand-built dict might)."""
    out = []
    for s in states:
        tensors = Upload.from_bytes(Upload(tensors=s).to_bytes()).tensors
        keys = list(tensors)
        rng.shuffle(keys)
        out.append({k: tensors[k] for k in keys})
    return out


def _hidden_from(seed: int, d: int) -> torch.Tensor:
    """The coordinates none of the draws of ``seed`` looks at."""
    seen = torch.zeros(d, dtype=torch.bool)
    for dims in dnc_draws(d, seed=seed):
        seen[dims] = True
    return (~seen).nonzero().flatten()


def _poisoned(states: list[dict], hidden: torch.Tensor, size: float = 50.0) -> list[dict]:
    """Client 4 adds ``size`` to its update on the ``hidden`` coordinates only."""
    flat = _flat(states[4]).clone()
    flat[hidden] += size
    out, offset = {}, 0
    for k in sorted(SHAPES):
        n = math.prod(SHAPES[k])
        out[k] = flat[offset : offset + n].reshape(SHAPES[k])
        offset += n
    return [*states[:4], out]


def test_the_same_seed_and_round_keep_the_same_clients_however_the_uploads_decode() -> None:
    """The reviewer decoded five uploads 20 times and got 8 kept sets; now
    every decoding, whatever order its dict holds the tensors in, gives the
    same model, bit for bit. (Here client 4's poison sits in the coordinates
    round 3's draw does not look at, in the sorted order of the tensors: a
    column order that followed the dict's would move the draw onto it.)"""
    d = sum(math.prod(s) for s in SHAPES.values())
    states = _poisoned(_honest_states(), _hidden_from(draw_seed(RUN_SEED, 3), d))
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    rng = random.Random(0)
    ref = _reference()
    _, updates = _updates(states, ref)
    assert dnc_keep(updates, 1, seed=draw_seed(RUN_SEED, 3)) == [0, 1, 3, 4]
    want = _flat(combine_states(_run(), states, weights, ref, round=3)).numpy().tobytes()
    for _ in range(20):
        got = combine_states(_run(), _decoded(states, rng), weights, ref, round=3)
        assert _flat(got).numpy().tobytes() == want


def test_each_round_draws_other_coordinates_and_the_same_round_the_same() -> None:
    d = sum(math.prod(s) for s in SHAPES.values())
    assert d > DNC_SUBSAMPLE
    firsts = []
    for r in range(4):
        again = dnc_draws(d, seed=draw_seed(RUN_SEED, r))
        draws = dnc_draws(d, seed=draw_seed(RUN_SEED, r))
        assert all(torch.equal(a, b) for a, b in zip(draws, again, strict=True))
        firsts.append(set(draws[0].tolist()))
        assert len({frozenset(x.tolist()) for x in draws}) == len(draws)  # 5 draws, 5 sets
    assert len({frozenset(f) for f in firsts}) == 4
    # and the secret: another seed with it, another with another secret
    seeds = {draw_seed(RUN_SEED, 0), draw_seed(RUN_SEED, 0, "a" * 64), draw_seed(0, 0, "b" * 64)}
    assert len(seeds) == 3


def test_a_poison_hidden_from_one_rounds_draw_is_dropped_in_the_rounds_after() -> None:
    """Client 4 knows the run seed and plans around round 0's draw: it puts a
    poison of +50 only in the ~1,700 coordinates none of that round's five
    draws looks at. In round 0 DnC cannot see it: it drops the honest client
    unlike the others (client 2) and the poison reaches the model. With the
    draw fresh each round, the next four rounds look at those coordinates and
    drop client 4 every time. With the draw of round 0 kept for every round
    (what a seed fixed per call did) the poison survived every round."""
    states = _honest_states()
    ref = _reference()
    d = sum(math.prod(s) for s in SHAPES.values())
    hidden = _hidden_from(draw_seed(RUN_SEED, 0), d)
    assert 1_000 < len(hidden) < 2_500
    poisoned = _poisoned(states, hidden)
    weights = [1.0] * 5
    _, updates = _updates(poisoned, ref)

    def poison_in(model: dict[str, torch.Tensor]) -> float:
        return float((_flat(model) - _flat(ref))[hidden].mean())

    kept = {}
    for r in range(5):
        kept[r] = dnc_keep(updates, 1, seed=draw_seed(RUN_SEED, r))
        model = combine_states(_run(), poisoned, weights, ref, round=r)
        assert poison_in(model) == pytest.approx(50 / 4 if 4 in kept[r] else 0.0, abs=0.05)
    assert kept[0] == [0, 1, 3, 4]  # the planned round: the honest outlier goes
    assert all(kept[r] == [0, 1, 2, 3] for r in range(1, 5))  # then the attacker, every round
    fixed = [dnc_keep(updates, 1, seed=draw_seed(RUN_SEED, 0)) for _ in range(5)]
    assert all(k == [0, 1, 3, 4] for k in fixed)


def test_with_the_servers_secret_not_even_the_first_round_can_be_planned() -> None:
    """On real sites the client knows the seed and the round but not the
    server's secret: the coordinates it computes as hidden from round 0 are
    looked at by the server's real draw, and it is dropped at once."""
    states = _honest_states()
    ref = _reference()
    d = sum(math.prod(s) for s in SHAPES.values())
    planned = _poisoned(states, _hidden_from(draw_seed(RUN_SEED, 0), d))
    secret = "5e" * 32
    _, updates = _updates(planned, ref)
    assert dnc_keep(updates, 1, seed=draw_seed(RUN_SEED, 0)) == [0, 1, 3, 4]
    assert dnc_keep(updates, 1, seed=draw_seed(RUN_SEED, 0, secret)) == [0, 1, 2, 3]
    got = combine_states(_run(secret), planned, [1.0] * 5, ref, round=0)
    want = aggregate_states(
        planned[:4], [1.0] * 4, ServerConfig(aggregator="mean"), rule="mean", reference=ref
    )
    assert all(torch.equal(got[k], want[k]) for k in SHAPES)


def test_dnc_keeps_every_client_when_no_coordinate_is_a_float() -> None:
    """Integer-only states (a counter, a step index) give d = 0: no singular
    direction exists, so DnC keeps all n clients and averages them as the
    mean rule does, instead of failing in the SVD."""
    states = [{"steps": torch.tensor([i, 2 * i])} for i in (1, 2, 6)]
    assert dnc_keep(torch.zeros(3, 0, dtype=torch.float64), 1) == [0, 1, 2]
    params = ServerConfig(aggregator="dnc", byzantine=1)
    got = aggregate_states(states, [1.0, 1.0, 1.0], params, rule="dnc")
    assert torch.equal(got["steps"], aggregate_states(states, [1.0, 1.0, 1.0], params)["steps"])
