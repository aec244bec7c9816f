"""SCAFFOLD (Karimireddy et al., ICML 2020): the corrected local step and its
control variates, option I and II, the server update with partial participation
(each by hand), and what the server knows of the clients' variates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientState
from osfl.fl.objectives import ScaffoldCorrection
from osfl.fl.upload import Upload
from osfl.methods.schemes import SchemeState
from support.by_hand import LR, close, ctx, grad_at, hand_run, make, params, small
from support.schemes import ce_grad, make_run, named, one_full_batch_step, simulate, tiny_model


def test_scaffold_step_is_corrected_by_c_minus_ci() -> None:
    m0 = tiny_model()
    g = ce_grad(tiny_model())
    c, ci = named(m0, 0.25), named(m0, -0.5)
    term = ScaffoldCorrection(c, ci)
    one_full_batch_step(m0, [term])
    init = tiny_model()
    for (k, p), p0 in zip(m0.named_parameters(), init.parameters(), strict=True):
        expected = p0 - 0.5 * (g[k] + 0.25 + 0.5)  # y - eta (g - c_i + c)
        torch.testing.assert_close(p.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    assert term.lr_sum == pytest.approx(0.5)


def test_scaffold_option_ii_by_hand() -> None:
    x = {"w": torch.tensor([1.0, 2.0])}
    y = {"w": torch.tensor([0.0, 3.0])}
    c, ci = {"w": torch.tensor([0.5, 0.5])}, {"w": torch.tensor([1.0, -1.0])}
    out = ScaffoldCorrection.option_ii(c, ci, x, y, lr_sum=0.5)
    # c_i - c + (x - y)/lr_sum = [1 - .5 + 2, -1 - .5 - 2]
    torch.testing.assert_close(out["w"], torch.tensor([2.5, -3.5]))
    with pytest.raises(ConfigError, match="at least one local step"):
        ScaffoldCorrection.option_ii(c, ci, x, y, lr_sum=0.0)


def test_scaffold_server_knows_the_client_control_variates(digits) -> None:
    train, _, fed = digits
    run = make_run(train, 5)
    method, res = simulate("scaffold", {"rounds": 2}, train, fed, run)
    state = res.state
    # c = (1/N) sum_i c_i with full participation and c_i(0) = 0
    mean_ci = {k: sum(state.clients[c]["c_i"][k] for c in range(5)) / 5 for k in state.server["c"]}
    for k, v in state.server["c"].items():
        torch.testing.assert_close(v, mean_ci[k], rtol=1e-5, atol=1e-6)
        for c in range(5):  # the server's copy equals the client's own c_i (its ClientState)
            own = res.client_states[c].tensors[f"c_i.{k}"]
            torch.testing.assert_close(state.clients[c]["c_i"][k], own)
    hist = method.audit_history(state, 3)
    head = "fc.bias"
    assert torch.equal(hist[f"history.scaffold.c.{head}"], state.server["c"][head])
    assert torch.equal(hist[f"history.scaffold.c_i.{head}"], state.clients[3]["c_i"][head])
    unseen = method.audit_history(dataclasses.replace(state, clients={}), 3)
    assert float(unseen[f"history.scaffold.c_i.{head}"].abs().sum()) == 0.0


# --------------------------------------------------------------------------- by hand (one client, full-batch SGD)
def test_scaffold_client_step_and_control_variate_by_hand(data: ImageSet) -> None:
    """SCAFFOLD's client (Karimireddy et al., ICML 2020, Alg. 1 l. 10-13): the
    local step is ``y = x - eta (g_i(x) - c_i + c)``; option II gives
    ``c_i+ = c_i - c + (x - y)/(K eta)``, which after one step is exactly the
    client's gradient at x (option I's ``c_i+ = g_i(x)``); the client keeps
    ``c_i+`` and uploads ``Delta c_i = c_i+ - c_i``."""
    run = hand_run()
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
    run = hand_run(epochs=2)
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
    run = hand_run(num_clients=4)
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
