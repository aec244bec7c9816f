"""What FALCON's client hands to its fits and its cache, and what the method
releases and reports (the mutants of ``osfl.methods.falcon.method`` the
mechanism tests did not see; TESTING.md, "Mutation testing").

The fits and the cache are replaced by recorders, so nothing trains: each
test checks the arguments a client's step passes on (the run's device, bar
and random stream, the cache key that keeps one client's model from
another's) and the exact records the server writes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any

import pytest
import torch

from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.progress import Progress
from osfl.fl.upload import Broadcast
from osfl.methods.falcon import method as falcon_method
from support.tiny import falcon, seed_ctx

META = torch.device("meta")  # a device a CPU can place modules on: where each one went shows


@pytest.fixture
def recorded(monkeypatch) -> dict[str, list[Any]]:
    """``fit`` and ``cached_module`` of the method module, recording their calls."""
    calls: dict[str, list[Any]] = {"fit": [], "cache": []}

    def fake_fit(model, data, loss, cfg, **kw) -> None:
        calls["fit"].append({"model": model, "data": data, "cfg": cfg, **kw})

    def fake_cache(ctx, model, parts, train):
        calls["cache"].append(parts)
        train()
        return model

    monkeypatch.setattr(falcon_method, "fit", fake_fit)
    monkeypatch.setattr(falcon_method, "cached_module", fake_cache)
    return calls


def _client(run: Any, client: int = 2) -> ClientContext:
    board = Progress()
    return ClientContext(
        dataclasses.replace(run, device=META, progress=board), client, 0, torch.Generator()
    )


@pytest.mark.parametrize(
    ("step", "stream", "name"),
    [
        ("train_classifier", "falcon-classifier", "falcon classifier"),
        ("train_generator", "falcon-generator", "falcon generator (mar)"),
    ],
)
def test_a_clients_fit_runs_on_the_runs_device_bar_and_its_own_stream(
    tiny, recorded, step: str, stream: str, name: str
) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    cctx = _client(ctx.run)
    tokens, labels = torch.randn(6, m.sequence_length(), 16), torch.arange(6) % 3
    model = getattr(m, step)(cctx, tokens, labels, {"tokens": "of client 2"})
    [call] = recorded["fit"]
    assert call["model"] is model and all(p.device == META for p in model.parameters())
    assert call["device"] == META and call["progress"] is cctx.run.progress
    assert call["description"] == f"client 2: {name}"
    assert call["generator"].initial_seed() == cctx.seed_for(stream)


def test_the_classifier_starts_from_the_shared_init_not_the_students(tiny, recorded) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    cctx = ClientContext(ctx.run, 1, 0, torch.Generator())
    tokens, labels = torch.randn(6, m.sequence_length(), 16), torch.arange(6) % 3
    model = m.train_classifier(cctx, tokens, labels, {})
    shared, student = m.new_classifier("classifier-init"), m.new_classifier("student-init")
    mine = dict(model.state_dict())
    assert all(torch.equal(mine[k], v) for k, v in shared.state_dict().items())
    assert not all(torch.equal(mine[k], v) for k, v in student.state_dict().items())


def test_each_cache_key_holds_every_input_that_makes_its_model(tiny, recorded) -> None:
    """The keys cached models are found by: the kind, the tokens' key, the
    run seed, the design (the generator's variant and model) and the fit
    recipe, and the generator's loss form, as plain data."""
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    tokens, labels = torch.randn(6, m.sequence_length(), 16), torch.arange(6) % 3
    cctx = ClientContext(ctx.run, 0, 0, torch.Generator())
    m.train_classifier(cctx, tokens, labels, {"tokens": "t0"})
    m.train_generator(cctx, tokens, labels, {"tokens": "t0"})
    assert recorded["cache"] == [
        {
            "kind": "falcon-classifier",
            "tokens": "t0",
            "seed": ctx.run.seed,
            "design": asdict(m.config.classifier),
            "fit": asdict(m.config.classifier_fit),
        },
        {
            "kind": "falcon-generator",
            "tokens": "t0",
            "seed": ctx.run.seed,
            "variant": "mar",
            "model": asdict(m.config.generator_model),
            "fit": asdict(m.config.generator_fit),
            "loss": "nll_mean_over_positions",
        },
    ]


def test_uploaded_sequences_are_drawn_from_the_clients_sample_stream(
    tiny, recorded, monkeypatch
) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, upload="sequences")
    drawn: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        falcon_method, "sequences_of", lambda gen, counts, g: drawn.append((counts, g)) or {}
    )
    data = ctx.splits.train.subset(ctx.federation.client_indices[1].copy())
    cctx = ClientContext(ctx.run, 1, 0, torch.Generator())
    up = m.client_update(cctx, m.broadcast(m.init_state(), 0), data)
    [(counts, sampler)] = drawn
    assert sampler.initial_seed() == cctx.seed_for("falcon-sample")
    assert up.meta["synthetic_counts"] == [int(n) for n in counts]


def test_a_generator_width_that_heads_do_not_divide_is_refused_naming_it(tiny) -> None:
    ctx = seed_ctx(tiny)  # tokens of width 16
    with pytest.raises(ConfigError, match=r"generator width 16 \(the token width when") as e:
        falcon(ctx, generator_model={"depth": 1, "heads": 3, "components": 3}).check()
    assert "generator_model.heads=3" in str(e.value)
    falcon(ctx, generator_model={"depth": 1, "heads": 3, "components": 3, "width": 12}).check()


def test_a_client_refuses_an_encoder_it_was_not_announced(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    data = ctx.splits.train.subset(ctx.federation.client_indices[1].copy())
    wrong = Broadcast(tensors={}, meta={"encoder_hash": "not-this-one"})
    with pytest.raises(ConfigError, match="client 1: the server announced encoder weights"):
        m.client_update(ClientContext(ctx.run, 1, 0, torch.Generator()), wrong, data)


def test_the_release_is_the_student_only_and_the_report_is_keyed_by_client(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    student = {"head.weight": torch.ones(2)}
    state = {"encoder": {"weights": "random"}, "student": student, "clients": {"c": 1}}
    assert m.release(state) == {"student": student}
    empty = m.report({"encoder": {"weights": "random"}})
    assert empty == {
        "encoder": {"weights": "random"},
        "sequence_length": m.sequence_length(),
        "generator": "mar",
        "bytes_up": {},
        "upload_form": {},
        "synthetic_sequences": {},
        "gflops_per_sample": None,
        "phases": {},
    }
    clients = {3: {"bytes": {"total": 9}, "form": "sequences", "synthetic": 12}}
    full = m.report({**state, "clients": clients, "gflops_per_sample": 0.5, "phases": {"s": 1.0}})
    assert (full["bytes_up"], full["upload_form"], full["synthetic_sequences"]) == (
        {"3": {"total": 9}},
        {"3": "sequences"},
        {"3": 12},
    )
    assert (full["gflops_per_sample"], full["phases"]) == (0.5, {"s": 1.0})
