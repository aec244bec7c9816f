"""Mechanism tests of the weight-averaging family: FedAvg's data-size
weighting, FedProx's proximal pull, SCAFFOLD's control variates, FedDyn's
dynamic regulariser and FedDC's drift variables (each on an example small
enough to work out by hand: one or two full-batch SGD steps of a small CNN
on 24 digits), and the Ensemble / Local predictors over the client models.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from osfl.config import method_config
from osfl.data.imageset import ImageSet
from osfl.data.sources import load_data
from osfl.data.transforms import build_transform
from osfl.fl.context import ClientContext, ClientState, ModelSpec, RunContext
from osfl.fl.method import METHODS, PerClientPredictor
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import Upload
from osfl.methods.clients import model_from_state
from osfl.methods.schemes import SchemeState

LR = 0.1


@pytest.fixture(scope="module")
def data() -> ImageSet:
    """24 digits at 16 px (the client of every hand example)."""
    train = load_data("digits", image_size=16, max_per_class=3).train
    return train.subset(torch.arange(24).numpy())


def make_run(num_clients: int = 4, **train: Any) -> RunContext:
    cfg = {"epochs": 1, "batch_size": 64, "lr": LR, "optimizer": "sgd", **train}
    tf = build_transform("none", image_size=16, mean=(0.5,), std=(0.5,))
    return RunContext(
        num_classes=10,
        image_shape=(1, 16, 16),
        num_clients=num_clients,
        model=ModelSpec("cnn_small", {"in_chans": 1, "img_size": 16}),
        train=TrainConfig(**cfg),
        train_transform=tf,
        eval_transform=tf,
        seed=0,
    )


def make(name: str, run: RunContext, **options: Any) -> Any:
    cls = METHODS.get(name)
    return cls(method_config(cls, options), run)


def ctx(run: RunContext, state: ClientState | None = None, client: int = 0) -> ClientContext:
    return ClientContext(run, client, 0, torch.Generator().manual_seed(0), state or ClientState())


def grad_at(run: RunContext, weights: dict[str, torch.Tensor], data: ImageSet) -> dict:
    """The mean cross-entropy gradient of the client's data at ``weights`` (train mode)."""
    model = model_from_state(run, weights).train()
    loss = F.cross_entropy(model(run.train_transform(data.images)), data.labels)
    loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def small(like: dict[str, torch.Tensor], seed: int, scale: float = 0.05) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(v.shape, generator=g) for k, v in like.items()}


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6)


def params(run: RunContext, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = [n for n, _ in model_from_state(run, state).named_parameters()]
    return {n: state[n] for n in names}


# --------------------------------------------------------------------------- FedAvg / FedProx
def test_fedavg_weights_the_clients_by_their_data_size() -> None:
    """FedAvg's server update (McMahan et al., AISTATS 2017, Alg. 1:
    ``w <- Σ_k n_k/n w_k``): a client with three times the data pulls the
    average three times as hard; ``weighting=uniform`` is the plain mean."""
    run = make_run()
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
    run = make_run(epochs=2)
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
        run = make_run(epochs=4, batch_size=8)
        m = make("fedprox", run, mu=mu)
        s = m.init_state()
        got = m.client_update(ctx(run), m.broadcast(s, 0), data).tensors
        return sum(float((got[k] - v).norm() ** 2) for k, v in params(run, s).items()) ** 0.5

    d = [drift(mu) for mu in (0.0, 1.0, 10.0)]
    assert d[0] > d[1] > d[2] and d[2] < 0.7 * d[0]


# --------------------------------------------------------------------------- SCAFFOLD
def test_scaffold_client_step_and_control_variate_by_hand(data: ImageSet) -> None:
    """SCAFFOLD's client (Karimireddy et al., ICML 2020, Alg. 1 l. 10-13): the
    local step is ``y = x - eta (g_i(x) - c_i + c)``; option II gives
    ``c_i+ = c_i - c + (x - y)/(K eta)``, which after one step is exactly the
    client's gradient at x (option I's ``c_i+ = g_i(x)``); the client keeps
    ``c_i+`` and uploads ``Delta c_i = c_i+ - c_i``."""
    run = make_run()
    method = make("scaffold", run)
    state = method.init_state()
    x = params(run, state.model)
    c, c_i = small(x, 1), small(x, 2)
    state.server["c"] = c
    own = ClientState(tensors={f"c_i.{k}": v for k, v in c_i.items()})
    up = method.client_update(ctx(run, own), method.broadcast(state, 0), data)
    g = grad_at(run, state.model, data)
    for k in x:
        close(up.tensors[k], x[k] - LR * (g[k] - c_i[k] + c[k]))
        close(own.tensors[f"c_i.{k}"], g[k])
        close(up.tensors[f"scaffold.delta_c.{k}"], g[k] - c_i[k])


def test_scaffold_option_i_control_variate_is_the_gradient_at_the_server_model(
    data: ImageSet,
) -> None:
    """SCAFFOLD's option I (Alg. 1 l. 12): ``c_i+ = g_i(x)``, the client's full
    gradient at the *server* model, whatever the local steps did (here two)."""
    run = make_run(epochs=2)
    method = make("scaffold", run, option="I")
    state = method.init_state()
    x = params(run, state.model)
    state.server["c"] = small(x, 1)
    own = ClientState(tensors={f"c_i.{k}": v for k, v in small(x, 2).items()})
    up = method.client_update(ctx(run, own), method.broadcast(state, 0), data)
    g = grad_at(run, state.model, data)
    for k in x:
        close(own.tensors[f"c_i.{k}"], g[k])
        assert not torch.allclose(up.tensors[k], x[k] - LR * g[k])  # two steps were taken


def test_scaffold_server_update_with_partial_participation_by_hand() -> None:
    """SCAFFOLD's server (Alg. 1 l. 16-17): ``x <- x + eta_g (mean_S y_i - x)``
    and ``c <- c + (1/N) Σ_S Delta c_i`` with N *all* the clients, S the
    round's; the server's copy of each participant's ``c_i`` grows by its
    ``Delta c_i``, the others' stay."""
    run = make_run(num_clients=4)
    method = make("scaffold", run, server_lr=0.5)
    s0 = method.init_state()
    names = method.param_names()
    s0.server["c"] = {k: torch.full_like(s0.model[k], 0.1) for k in names}
    s0.clients[2] = {"c_i": {k: torch.full_like(s0.model[k], 0.3) for k in names}}
    uploads = {}
    for c, (dy, dc) in {1: (0.2, 0.4), 3: (0.6, -0.8)}.items():
        t = {k: v.clone() for k, v in s0.model.items()}
        for k in names:
            t[k] = t[k] + dy
            t[f"scaffold.delta_c.{k}"] = torch.full_like(s0.model[k], dc)
        uploads[c] = Upload(tensors=t, meta={"num_samples": 10 * c})
    s1 = method.aggregate(s0, uploads, 0)
    for k in names:
        close(s1.model[k], s0.model[k] + 0.5 * 0.4)  # uniform mean of 0.2 and 0.6, halved
        close(s1.server["c"][k], torch.full_like(s0.model[k], 0.1 + (0.4 - 0.8) / 4))
        close(s1.clients[1]["c_i"][k], torch.full_like(s0.model[k], 0.4))
        close(s1.clients[3]["c_i"][k], torch.full_like(s0.model[k], -0.8))
        close(s1.clients[2]["c_i"][k], torch.full_like(s0.model[k], 0.3))
    assert isinstance(s1, SchemeState) and float(s0.server["c"][names[0]].mean()) == pytest.approx(
        0.1
    )


# --------------------------------------------------------------------------- FedDyn
def test_feddyn_client_step_and_gradient_state_by_hand(data: ImageSet) -> None:
    """FedDyn's client (Acar et al., ICLR 2021, Alg. 1 l. 6-7): the local
    objective ``L_k(θ) - <g_k, θ> + α/2 ||θ - θ^{t-1}||²`` has gradient
    ``g(θ) - g_k`` at the broadcast weights, so one step gives
    ``θ_k = θ - eta (g(θ) - g_k)``; then ``g_k <- g_k - α (θ_k - θ)``."""
    run = make_run()
    alpha = 0.5
    method = make("feddyn", run, alpha=alpha)
    state = method.init_state()
    theta = params(run, state.model)
    g_k = small(theta, 3)
    own = ClientState(tensors={f"grad.{k}": v for k, v in g_k.items()})
    up = method.client_update(ctx(run, own), method.broadcast(state, 0), data)
    g = grad_at(run, state.model, data)
    for k in theta:
        step = theta[k] - LR * (g[k] - g_k[k])
        close(up.tensors[k], step)
        close(own.tensors[f"grad.{k}"], g_k[k] - alpha * (step - theta[k]))


# --------------------------------------------------------------------------- FedDC
def test_feddc_client_step_drift_and_correction_by_hand(data: ImageSet) -> None:
    """FedDC's client (Gao et al., CVPR 2022; Chen & Vikalo, ICML 2024, Eq.
    81-82): the local objective ``L_k(θ) + α/2 ||θ + d_k - w||² + <θ, (Δθ_k -
    ΔΘ)/(eta K)>`` has gradient ``g(w) + α d_k + (Δθ_k - ΔΘ)/(eta K)`` at the
    global weights; after the step the drift grows by the local update,
    ``d_k <- d_k + (θ_k - w)``, and the update is kept for the next round."""
    run = make_run()
    alpha = 0.5
    method = make("feddc", run, alpha=alpha)
    state = method.init_state()
    w = params(run, state.model)
    d_k, last, global_update = small(w, 4), small(w, 5), small(w, 6)
    state.server["global_update"] = global_update
    own = ClientState(
        tensors={
            **{f"drift.{k}": v for k, v in d_k.items()},
            **{f"update.{k}": v for k, v in last.items()},
        }
    )
    up = method.client_update(ctx(run, own), method.broadcast(state, 0), data)
    g = grad_at(run, state.model, data)
    for k in w:
        corr = (last[k] - global_update[k]) / LR  # K = 1 step of eta
        step = w[k] - LR * (g[k] + alpha * d_k[k] + corr)
        close(up.tensors[k], step)
        close(own.tensors[f"drift.{k}"], d_k[k] + (step - w[k]))
        close(own.tensors[f"update.{k}"], step - w[k])


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
    run = make_run(num_clients=2)
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
    run = make_run(num_clients=2)
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
