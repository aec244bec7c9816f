"""FedDyn (Acar et al., ICLR 2021): the dynamic regulariser's value and
gradient, the client step and its gradient state, and the server update, by hand."""

from __future__ import annotations

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.context import ClientState
from osfl.fl.method import METHODS
from osfl.fl.objectives import FedDynTerm
from support.by_hand import LR, close, ctx, grad_at, hand_run, make, params, small
from support.schemes import fake_uploads, make_run, named, tiny_model


def test_feddyn_loss_value_and_gradient() -> None:
    w, model = tiny_model(0), tiny_model(1)
    grad_state = named(model, 0.125)
    alpha = 0.25
    term = FedDynTerm(dict(w.named_parameters()), grad_state, alpha)
    term.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = term.extra_loss(model)
    loss.backward()
    for p, pw in zip(model.parameters(), w.parameters(), strict=True):
        expected = -0.125 + alpha * (p.detach() - pw.detach())
        torch.testing.assert_close(p.grad, expected)
    new = term.next_grad_state(model)
    for (k, p), pw in zip(model.named_parameters(), w.parameters(), strict=True):
        torch.testing.assert_close(new[k], 0.125 - alpha * (p.detach() - pw.detach()))


def test_feddyn_server_update_by_hand(digits) -> None:
    train, _, _ = digits
    run = make_run(train, 4)
    cls = METHODS.get("feddyn")
    alpha = 0.5
    method = cls(cls.Config(alpha=alpha), run)
    s0 = method.init_state()
    ups = fake_uploads(method, s0, {0: 0.1, 1: 0.3}, {0: 10, 1: 30})
    s1 = method.aggregate(s0, ups, 0)
    k = method.param_names()[0]
    # h = -alpha/N * (0.1 + 0.3); theta = mean(theta_k) - h/alpha (uniform mean)
    h = -alpha / 4 * 0.4
    torch.testing.assert_close(s1.server["h"][k], torch.full_like(s0.model[k], h))
    expected = s0.model[k] + 0.2 - h / alpha
    torch.testing.assert_close(s1.model[k], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        s1.clients[1]["grad"][k], torch.full_like(s0.model[k], -alpha * 0.3), rtol=1e-5, atol=1e-7
    )
    assert s1 is not s0 and float(s0.server["h"][k].abs().sum()) == 0.0  # old state untouched
    # a second round: the server's record of grad_k accumulates (Alg. 1 l. 7),
    # -alpha (0.3 + 0.2) for client 1; client 0, not sampled, keeps its own
    s2 = method.aggregate(s1, fake_uploads(method, s1, {1: 0.2}, {1: 30}), 1)
    torch.testing.assert_close(
        s2.clients[1]["grad"][k], torch.full_like(s0.model[k], -alpha * 0.5), rtol=1e-5, atol=1e-7
    )
    torch.testing.assert_close(s2.clients[0]["grad"][k], s1.clients[0]["grad"][k])


# --------------------------------------------------------------------------- by hand (one client, full-batch SGD)
def test_feddyn_client_step_and_gradient_state_by_hand(data: ImageSet) -> None:
    """FedDyn's client (Acar et al., ICLR 2021, Alg. 1 l. 6-7): the local
    objective ``L_k(θ) - <g_k, θ> + α/2 ||θ - θ^{t-1}||²`` has gradient
    ``g(θ) - g_k`` at the broadcast weights, so one step gives
    ``θ_k = θ - eta (g(θ) - g_k)``; then ``g_k <- g_k - α (θ_k - θ)``."""
    run = hand_run()
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
