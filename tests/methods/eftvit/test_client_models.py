"""EFTViT's records score both predictors: every client's own model (its
private local module under the broadcast global module and head, on whole
test images; the paper's evaluation: ``mean_client_accuracy``) and the
server's predictor (the pretrained local module under the same global module:
``global_test_accuracy``, in every round as in the record). Checked against
the computation done by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.errors import DataError
from osfl.fl.context import ClientState
from osfl.fl.evaluate import check_client_score
from osfl.fl.method import METHODS, OwnModels, capability
from osfl.fl.own_models import merge_client_models
from osfl.fl.runtime.simulation import InProcessClients, SimulationRuntime
from osfl.report import summarize, table_rows
from osfl.run_record import accuracy_curve
from support.smoke import SMALL_VIT_SPLIT

BASE = (
    *SMALL_VIT_SPLIT,
    "train.batch_size=16",
    "cache_dir=null",
    "seeds=[0]",
    "methods=[eftvit]",
)


def job_and_test(*extra: str) -> tuple[Any, Any]:
    cfg = load_config(None, [*BASE, *METHODS.get("eftvit").card.smoke, *extra])
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    return assembly.build_job(cfg, "eftvit", ctx), ctx.splits.test


def by_hand(model: torch.nn.Module, test: Any, run: Any) -> float:
    """Accuracy of ``model`` on the whole (unmasked) test images, counted by hand."""
    with torch.no_grad():
        pred = model.eval()(run.eval_transform(test.images)).argmax(dim=1)
    return int((pred == test.labels).sum()) / len(test.labels)


def test_the_accuracy_is_the_mean_of_the_clients_own_models_by_hand() -> None:
    """One client per round for two rounds of three clients: every evaluated
    round's ``mean_client_accuracy`` is the mean over all three clients of
    each one's ``client_predictor`` (a client never sampled: its empty state,
    i.e. the pretrained local module), and ``global_test_accuracy`` the server
    predictor's."""
    job, test = job_and_test(
        "method.eftvit.client_fraction=0.34", "method.eftvit.rounds=2", "eval_every=1"
    )
    m, run = job.method, job.run
    result = SimulationRuntime().execute(job)
    metrics = result.metrics
    sampled = sorted({c for r in result.rounds for c in r.clients})
    assert sorted(result.client_states) == sampled and len(sampled) < 3
    assert metrics["clients_not_sampled"] == [c for c in range(3) if c not in sampled]
    assert result.rounds[0].metrics["clients_not_sampled"] == [
        c for c in range(3) if c not in result.rounds[0].clients
    ]

    b = m.broadcast(result.state, 2)  # what a client would receive after the last round
    own = [
        by_hand(m.client_predictor(b, result.client_states.get(c, ClientState())), test, run)
        for c in range(3)
    ]
    assert metrics["client_accuracies"] == own
    assert metrics["mean_client_accuracy"] == pytest.approx(sum(own) / 3, abs=1e-12)
    # the server's predictor, scored as before: the pretrained local module
    server = by_hand(m.global_model(result.state), test, run)
    assert metrics["global_test_accuracy"] == server
    assert metrics["global_test_accuracy"] == by_hand(result.predictor, test, run)
    assert "server_accuracy" not in metrics  # one name per number
    # a client never sampled holds the pretrained local module: with the head
    # broadcast, its model is the server's predictor
    for c in metrics["clients_not_sampled"]:
        assert own[c] == server
    # the per-round curve of the record carries both, each under its name
    curve = accuracy_curve(result)
    assert [p["round"] for p in curve] == [0, 1]
    assert curve[-1]["global_test_accuracy"] == server
    assert curve[-1]["mean_client_accuracy"] == metrics["mean_client_accuracy"]
    for p, r in zip(curve, result.rounds, strict=True):
        assert p["global_test_accuracy"] == r.metrics["global_test_accuracy"]
        assert p["mean_client_accuracy"] == r.metrics["mean_client_accuracy"]


def test_a_clients_own_model_is_its_private_local_module() -> None:
    """Scoring a client's model uses the local module of its state: a state
    whose patch embedding is zeroed predicts one class for every image (the
    pretrained module would not), and that is the score the client reports."""
    job, test = job_and_test("method.eftvit.rounds=1")
    m, run = job.method, job.run
    result = SimulationRuntime().execute(job)
    b = m.broadcast(result.state, 1)
    kept = result.client_states[0].tensors
    wrecked = ClientState(
        tensors={
            **kept,
            "patch_embed.proj.weight": torch.zeros_like(kept["patch_embed.proj.weight"]),
            "patch_embed.proj.bias": torch.zeros_like(kept["patch_embed.proj.bias"]),
        }
    )
    x = run.eval_transform(test.images)
    with torch.no_grad():
        logits = m.client_predictor(b, wrecked).eval()(x)
        server_logits = m.global_model(result.state).eval()(x)
    assert torch.allclose(logits, logits[:1].expand_as(logits))  # one output for every image
    assert not torch.allclose(server_logits, server_logits[:1].expand_as(server_logits))

    transport = InProcessClients(job)
    transport.states = {0: wrecked.to_bytes(), 1: result.client_states[1].to_bytes()}
    scores, failures = transport.score_client_models(b.to_bytes(), [0, 1, 2])
    assert failures == {}
    assert scores[0]["global_test_accuracy"] == by_hand(m.client_predictor(b, wrecked), test, run)
    pred = logits.argmax(dim=1)
    assert scores[0]["global_test_accuracy"] == int((pred == test.labels).sum()) / len(test)
    assert scores[1]["global_test_accuracy"] == by_hand(
        m.client_predictor(b, result.client_states[1]), test, run
    )
    # client 2 has no state: the pretrained local module, i.e. the server's predictor
    assert scores[2]["global_test_accuracy"] == by_hand(m.global_model(result.state), test, run)
    assert capability(m, OwnModels) is m


def test_merge_keeps_both_predictors_and_names_clients_that_did_not_score() -> None:
    """The server predictor's numbers keep their names, the clients' are
    beside them under their own (one name per number), computed by hand."""
    server = {
        "global_test_accuracy": 0.375,
        "per_class_accuracy": [0.375, None],
        "num_samples": 4,
        "validation_accuracy": 0.25,
        "local_test_accuracies": [0.5, 0.5, 0.5],
        "local_test_accuracy": 0.5,
        "nonfinite_outputs": 1,
    }
    scores = {
        0: {
            "global_test_accuracy": 1.0,
            "per_class_accuracy": [1.0, None],
            "validation_accuracy": 0.75,
            "local_test_accuracies": [1.0, 0.0, 0.0],
        },
        2: {
            "global_test_accuracy": 0.0,
            "per_class_accuracy": [0.0, None],
            "validation_accuracy": 0.25,
            "local_test_accuracies": [0.0, 0.0, 0.5],
            "nonfinite_outputs": 2,
            "warnings": ["non-finite"],
        },
    }
    out = merge_client_models(server, scores, 3)
    assert out == {
        # the server predictor's, as the evaluator named them
        **server,
        # the clients' own models': the mean over the clients that scored (0 and 2)
        "mean_client_accuracy": 0.5,
        "client_accuracies": [1.0, None, 0.0],
        "mean_client_per_class_accuracy": [0.5, None],
        "mean_client_validation_accuracy": 0.5,
        "client_local_test_accuracies": [1.0, 0.5],  # each client's own model, own mix
        "mean_client_local_test_accuracy": 0.75,
        "client_nonfinite_outputs": 2,
        "warnings": ["client 2's own model: non-finite"],
    }
    with pytest.raises(DataError, match="no client"):
        merge_client_models(server, {}, 3)


def test_a_malformed_client_score_is_refused() -> None:
    good = {"global_test_accuracy": 0.5, "per_class_accuracy": [0.5, None]}
    assert check_client_score(good, 2, 3, 1) == good
    for bad in (
        [],
        {**good, "global_test_accuracy": 1.5},
        {**good, "global_test_accuracy": True},
        {**good, "per_class_accuracy": [0.5]},
        {**good, "validation_accuracy": "x"},
        {**good, "local_test_accuracies": [0.5]},
    ):
        with pytest.raises(DataError, match="client 1"):
            check_client_score(bad, 2, 3, 1)


def test_tables_show_the_clients_own_models_beside_the_server_predictor() -> None:
    """The accuracy column is the server predictor's (the record's
    ``global_test_accuracy``); the clients' mean has its own column."""
    eftvit = {"method": "eftvit", "seed": 0, "global_test_accuracy": 0.4}
    eftvit |= {"mean_client_accuracy": 0.6}
    recs = [eftvit, {"method": "fedfull", "seed": 0, "global_test_accuracy": 0.5}]
    header, cells = table_rows(summarize(recs))
    i = header.index("clients' own models (%)")
    assert header[i - 1] == "accuracy (%)"
    assert [c[i - 1] for c in cells] == ["40.00", "50.00"]
    assert [c[i] for c in cells] == ["60.00", "—"]
    plain, _ = table_rows(summarize(recs[1:]))
    assert "clients' own models (%)" not in plain


def test_the_transports_only_carry_the_scoring_of_clients_own_models() -> None:
    """Evaluation is not a transport's job: the in-process clients, the
    Flower ClientApp and the round loop know nothing of ``OwnModels``; both
    transports hand the broadcast and a client's state to the one scorer
    (:func:`~osfl.fl.own_models.score_client_predictor`), so a node under
    Flower scores what the simulation scores."""
    import inspect  # here: only this test reads sources

    import osfl.fl.own_models as own_models
    import osfl.fl.runtime.client as runtime_client
    import osfl.fl.runtime.rounds as rounds
    import osfl.fl.runtime.simulation as simulation
    import osfl.flower.client as flower_client

    for module in (runtime_client, rounds, simulation, flower_client):
        source = inspect.getsource(module)
        assert "OwnModels" not in source and ".client_predictor(" not in source, module.__name__
    assert flower_client.score_client_predictor is own_models.score_client_predictor
    assert simulation.score_kept_states is own_models.score_kept_states
