"""Mechanism tests of the weight-averaging family: FedAvg's data-size
weighting, FedProx's proximal pull, (SCAFFOLD's, FedDyn's and
FedDC's: tests/methods/schemes/) (each on an example small
enough to work out by hand: one or two full-batch SGD steps of a small CNN
on 24 digits), and the Ensemble / Local predictors over the client models.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from osfl.data.imageset import ImageSet
from osfl.fl.context import RunContext
from osfl.fl.method import PerClientPredictor
from osfl.fl.upload import Upload
from osfl.methods.clients import model_from_state
from support.by_hand import LR, close, ctx, grad_at, hand_run, make, params, small


# --------------------------------------------------------------------------- FedAvg / FedProx
def test_fedavg_weights_the_clients_by_their_data_size() -> None:
    """FedAvg's server update (McMahan et al., AISTATS 2017, Alg. 1:
    ``w <- Σ_k n_k/n w_k``): a client with three times the data pulls the
    average three times as hard; ``weighting=uniform`` is the plain mean."""
    run = hand_run()
    method = make("fedavg", run)
    state = method.init_state()
    zeros = {k: torch.zeros_like(v) for k, v in state.items()}
    ones = {k: torch.ones_like(v) for k, v in state.items()}
    uploads = {
        0: Upload(tensors=zeros, meta={"num_samples": 10}),
        2: Upload(tensors=ones, meta={"num_samples": 30}),
    }
    for weighting, share in (("data_size", 0.75), (None, 0.75), ("uniform", 0.5)):
        opts = {} if weighting is None else {"weighting": weighting}  # None: the default
        new = make("fedavg", run, **opts).aggregate(state, uploads, 0)
        for v in new.values():
            if v.is_floating_point():
                close(v, torch.full_like(v, share))


def test_fedprox_proximal_term_pulls_towards_the_global_weights(data: ImageSet) -> None:
    """FedProx's local objective (Li et al., MLSys 2020, Eq. 2: ``F_k(w) +
    mu/2 ||w - w^t||²``): two full-batch SGD steps equal the hand-computed
    ``w1 = w - eta g(w)``, ``w2 = w1 - eta (g(w1) + mu (w1 - w))``; and a
    larger mu leaves the client nearer the broadcast weights."""
    run = hand_run(epochs=2)
    mu = 2.0
    method = make("fedprox", run, mu=mu)
    state = method.init_state()
    up = method.client_update(ctx(run), method.broadcast(state, 0), data)
    w = params(run, state)
    g0 = grad_at(run, state, data)
    w1 = {k: w[k] - LR * g0[k] for k in w}
    g1 = grad_at(run, {**state, **w1}, data)
    for k in w:
        close(up.tensors[k], w1[k] - LR * (g1[k] + mu * (w1[k] - w[k])))

    def drift(mu: float) -> float:
        run = hand_run(epochs=4, batch_size=8)
        m = make("fedprox", run, mu=mu)
        s = m.init_state()
        got = m.client_update(ctx(run), m.broadcast(s, 0), data).tensors
        return sum(float((got[k] - v).norm() ** 2) for k, v in params(run, s).items()) ** 0.5

    d = [drift(mu) for mu in (0.0, 1.0, 10.0)]
    assert d[0] > d[1] > d[2] and d[2] < 0.7 * d[0]


# --------------------------------------------------------------------------- SCAFFOLD


# --------------------------------------------------------------------------- FedDyn


# --------------------------------------------------------------------------- FedDC


# --------------------------------------------------------------------------- Ensemble / Local
def _client_states(run: RunContext) -> dict[int, dict[str, torch.Tensor]]:
    """Two distinct client models: the initial weights plus noise (BN statistics kept)."""
    base = make("fedavg", run).init_state()
    trained = params(run, base)
    return {
        c: {
            **base,
            **{
                k: v + d
                for k, v, d in zip(
                    trained, trained.values(), small(trained, 10 + c, 0.5).values(), strict=True
                )
            },
        }
        for c in range(2)
    }


@pytest.mark.parametrize(
    ("weighting", "weights"), [("uniform", (0.5, 0.5)), ("data_size", (0.25, 0.75))]
)
def test_ensemble_averages_the_clients_probabilities(weighting: str, weights: tuple) -> None:
    """The Ensemble reference (Guha et al., 2019; the "Ensemble" rows of
    DENSE, Co-Boosting, FedMITR): the mean of the client models' *softmax
    outputs*, weighted uniformly or by data size."""
    run = hand_run(num_clients=2)
    states = _client_states(run)
    method = make("ensemble", run, weighting=weighting)
    state = method.aggregate(
        method.init_state(),
        {c: Upload(tensors=s, meta={"num_samples": 10 * (2 * c + 1)}) for c, s in states.items()},
        0,
    )
    x = torch.randn(6, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = method.predictor(state).eval()(x)
        probs = [F.softmax(model_from_state(run, states[c]).eval()(x), -1) for c in range(2)]
    close(got, weights[0] * probs[0] + weights[1] * probs[1])


def test_local_keeps_every_client_model_on_its_own() -> None:
    """Local, the one-shot floor (e.g. FedMITR Table 1): each client's own
    model, unaveraged."""
    run = hand_run(num_clients=2)
    states = _client_states(run)
    method = make("local", run)
    state = method.aggregate(
        method.init_state(),
        {c: Upload(tensors=s, meta={"num_samples": 10}) for c, s in states.items()},
        0,
    )
    pred = method.predictor(state)
    assert isinstance(pred, PerClientPredictor) and len(pred.models) == 2
    for model, c in zip(pred.models, sorted(states), strict=True):
        for k, v in model.state_dict().items():
            assert torch.equal(v, states[c][k])
