"""Mechanism tests of FENS (Allouah et al., NeurIPS 2024): a learned aggregator over
the clients' logits. Its protocol runs step by step on the smoke task (digits
at 8 px, three clients), calling the method's own parts: the clients keep the
members' logits on their held-out share, the aggregator is one SGD step on
them, and the server takes a FedAdam step toward the weighted mean."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from osfl.fl.context import ClientState
from osfl.fl.upload import Upload
from osfl.methods.fens import split_client_data
from support.smoke import client_ctx, first_aggregation, smoke_job


# --------------------------------------------------------------------------- FENS
@pytest.fixture(scope="module")
def fens() -> dict[str, Any]:
    job = smoke_job("fens", "data.max_per_class=30")
    method = job.method
    state0, uploads = first_aggregation(job)
    state = method.aggregate(state0, uploads, 0)
    own = ClientState()
    data = job.clients.data(0)
    broadcast = method.broadcast(state, 1)
    up = method.client_update(client_ctx(job, 0, 1, own), broadcast, data)
    return {"job": job, "state": state, "own": own, "data": data, "up": up, "b": broadcast}


def test_fens_clients_keep_the_members_logits_on_their_held_out_share(fens) -> None:
    """FENS's second phase (Allouah et al., NeurIPS 2024; sacs-epfl/fens
    ``generate_logits_v2.py``): each client runs the K received (INT8,
    dequantised) client models over its held-out share (the evaluation
    transform) once; those logits and labels stay in its state, the
    aggregator's training input."""
    job, state, data = fens["job"], fens["state"], fens["data"]
    method = job.method
    logits = fens["own"].tensors["heldout_logits"]
    held = split_client_data(data, method.config.holdout, job.run.seed, 0)[1]
    assert 1 <= len(held) < len(data)
    x = job.run.eval_transform(held.images)
    with torch.no_grad():
        want = torch.stack(
            [method.member_model(state["members"][c]).eval()(x) for c in sorted(state["members"])],
            dim=1,
        )
    assert logits.shape == (len(held), 3, job.run.num_classes)
    torch.testing.assert_close(logits, want)
    assert torch.equal(fens["own"].tensors["heldout_labels"], held.labels)
    assert not any(k.startswith(("member", "heldout")) for k in fens["up"].tensors)  # never leave


def test_fens_aggregator_is_one_sgd_step_on_the_client_logits(fens) -> None:
    """FENS trains a small aggregator ``g(f_1(x), ..., f_K(x))`` on the
    held-out logits: the authors' round is one plain SGD step at lr 1 on a
    batch of 128 (here the client's whole held-out share, fewer than 128), so
    the uploaded aggregator is the received one minus the gradient of the
    mean cross-entropy there (at lr 1 one such step may overshoot; the server's
    FedAdam step of 1e-3 is what moves the global aggregator). A later round
    starts from the aggregator it receives."""
    job, up = fens["job"], fens["up"]
    method = job.method
    logits = fens["own"].tensors["heldout_logits"]
    labels = fens["own"].tensors["heldout_labels"]
    assert len(labels) <= method.config.local.batch_size
    received = method.new_aggregator(3)
    received.load_state_dict(
        {
            k[len("aggregator.") :]: v
            for k, v in fens["b"].tensors.items()
            if k.startswith("aggregator.")
        }
    )
    loss = F.cross_entropy(received(logits), labels)
    loss.backward()
    for name, p in received.named_parameters():
        torch.testing.assert_close(up.tensors[name], (p - method.config.local.lr * p.grad).detach())
    assert up.meta["num_samples"] == len(labels)  # the samples its step saw
    shifted = {
        k: v + 0.5 if k.startswith("aggregator.") else v for k, v in fens["b"].tensors.items()
    }
    later = {
        name: method.client_update(
            client_ctx(job, 0, 2, fens["own"]),
            type(fens["b"])(tensors=tensors, meta=fens["b"].meta),
            fens["data"],
        ).tensors
        for name, tensors in (("received", fens["b"].tensors), ("shifted", shifted))
    }
    assert any(not torch.equal(later["shifted"][k], v) for k, v in later["received"].items())


def test_fens_server_takes_a_fedadam_step_toward_the_weighted_mean(fens) -> None:
    """The server weights the clients' aggregators by the samples their steps
    saw and takes a FedAdam step (Reddi et al., 2021; the authors'
    ``distoptim/FedAdam.py``, no bias correction) on the pseudo-gradient
    ``Δ = mean − x``: from zero moments ``x + lr · 0.1Δ / (√(0.01Δ²) + τ)``.
    It predicts with that aggregator over the members' logits."""
    method, state = fens["job"].method, fens["state"]
    opt = method.config.server_opt
    agg = state["aggregator"]
    zeros = {k: torch.zeros_like(v) for k, v in agg.items()}
    ones = {k: torch.ones_like(v) for k, v in agg.items()}
    new = method.aggregate(
        state,
        {0: Upload(zeros, {"num_samples": 10}), 1: Upload(ones, {"num_samples": 30})},
        1,
    )
    for k, x in agg.items():
        x = x.double()
        delta = 0.75 - x
        m, v = (1 - opt.beta1) * delta, (1 - opt.beta2) * delta**2
        want = x + opt.lr * m / (v.sqrt() + opt.tau)
        torch.testing.assert_close(new["aggregator"][k], want.float())
    assert set(new["server_opt"])  # the moments carry into the next round
    new = method.aggregate(state, {0: fens["up"]}, 1)
    pred = method.predictor(new).eval()
    x = fens["job"].run.eval_transform(fens["data"].images[:8])
    aggregator = method.new_aggregator(3)
    aggregator.load_state_dict(new["aggregator"])
    with torch.no_grad():
        torch.testing.assert_close(
            pred(x), aggregator(torch.stack([m(x) for m in pred.members], 1))
        )
