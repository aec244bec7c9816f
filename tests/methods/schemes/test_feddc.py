"""FedDC (Gao et al., CVPR 2022): the drift penalty and correction, the client
step with its drift and update variables, the server update (by hand), and
the audit history naming exactly what the server knows."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.context import ClientState
from osfl.fl.method import METHODS
from osfl.fl.objectives import FedDCTerm
from support.by_hand import LR, close, ctx, grad_at, hand_run, make, params, small
from support.schemes import fake_uploads, make_run, named, tiny_model


def test_feddc_penalty_and_correction() -> None:
    w, model = tiny_model(0), tiny_model(1)
    drift, corr = named(model, 0.5), named(model, -0.25)
    alpha = 0.5
    term = FedDCTerm(dict(w.named_parameters()), drift, corr, alpha)
    term.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    term.extra_loss(model).backward()
    term.before_step(model)
    for p, pw in zip(model.parameters(), w.parameters(), strict=True):
        expected = alpha * (p.detach() + 0.5 - pw.detach()) - 0.25
        torch.testing.assert_close(p.grad, expected)


def _feddc_after_one_round(digits) -> tuple[Any, Any, Any, Any, Any, str]:
    """FedDC (α 0.1, lr 0.1, 2 local steps) after one round of two fake
    uploads that moved every weight by 0.1 and 0.3: (cls, run, method, s0, s1, key)."""
    train, _, _ = digits
    run = make_run(train, 2, epochs=1, batch_size=8, lr=0.1)
    cls = METHODS.get("feddc")
    method = cls(cls.Config(alpha=0.1), run)
    s0 = method.init_state()
    s1 = method.aggregate(s0, fake_uploads(method, s0, {0: 0.1, 1: 0.3}, {0: 16, 1: 16}), 0)
    return cls, run, method, s0, s1, method.param_names()[0]


def test_feddc_server_update_by_hand(digits) -> None:
    _, _, method, s0, s1, k = _feddc_after_one_round(digits)
    # w = mean(theta_k + d_k) with d_k = Delta_k: w0 + 2 * mean(Delta) = w0 + 0.4
    torch.testing.assert_close(s1.model[k], s0.model[k] + 0.4, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1.server["global_update"][k], torch.full_like(s0.model[k], 0.2))
    hist = method.audit_history(s1, 1, {"num_samples": 16})
    # correction = (Delta_1 - DeltaTheta) / (eta K) = (0.3 - 0.2) / (0.1 * 2)
    corr = hist[f"history.feddc.correction.{k}"]
    torch.testing.assert_close(corr, torch.full_like(corr, 0.5), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hist[f"history.feddc.drift.{k}"], torch.full_like(corr, 0.3))


def test_feddc_second_round_averages_the_models_plus_their_accumulated_drift(digits) -> None:
    """From round 2 on the server's average is of theta_k + h_k with h_k the
    drift accumulated over the rounds (Gao et al., CVPR 2022, Alg. 1), not
    this round's update: drifts 0.1 + 0.2 and 0.3 - 0.1, models w1 + 0.2 and
    w1 - 0.1, so w2 = w1 + mean(0.5, 0.1) = w1 + 0.3 (this round's updates
    alone would give w1 + 0.1)."""
    _, _, method, _, s1, k = _feddc_after_one_round(digits)
    s2 = method.aggregate(s1, fake_uploads(method, s1, {0: 0.2, 1: -0.1}, {0: 16, 1: 16}), 1)
    torch.testing.assert_close(s2.model[k], s1.model[k] + 0.3, rtol=1e-5, atol=1e-6)
    drift = method.audit_history(s2, 1, {"num_samples": 16})[f"history.feddc.drift.{k}"]
    torch.testing.assert_close(drift, torch.full_like(drift, 0.2), rtol=1e-5, atol=1e-6)


def test_feddc_audit_history_names_exactly_what_the_server_knows(digits) -> None:
    """RLU's h term for FedDC: the client's drift, and with the correction on
    and a sample count the correction, the global update and the client's
    last update (zeros for a client the server has not seen); nothing else."""
    cls, run, method, s0, s1, k = _feddc_after_one_round(digits)
    names = lambda h: {key.split(".")[2] for key in h}  # noqa: E731
    hist = method.audit_history(s1, 1, {"num_samples": 16})
    assert names(hist) == {"drift", "correction", "global_update", "update"}
    torch.testing.assert_close(
        hist[f"history.feddc.global_update.{k}"], torch.full_like(s0.model[k], 0.2)
    )
    torch.testing.assert_close(hist[f"history.feddc.update.{k}"], torch.full_like(s0.model[k], 0.3))
    unseen = method.audit_history(dataclasses.replace(s1, clients={}), 1, {"num_samples": 16})
    assert float(unseen[f"history.feddc.drift.{k}"].abs().sum()) == 0.0
    assert float(unseen[f"history.feddc.update.{k}"].abs().sum()) == 0.0
    torch.testing.assert_close(  # no previous update: -DeltaTheta / (eta K) = -0.2 / 0.2
        unseen[f"history.feddc.correction.{k}"], torch.full_like(s0.model[k], -1.0)
    )
    assert names(method.audit_history(s1, 1)) == {"drift"}  # no sample count: no correction
    assert names(method.audit_history(s1, 1, {"num_samples": 0})) == {"drift"}
    assert len(names(method.audit_history(s1, 1, {"num_samples": 1}))) == 4  # one sample is a count
    off = cls(cls.Config(alpha=0.1, correction=False), run)
    assert names(off.audit_history(s1, 1, {"num_samples": 16})) == {"drift"}


# --------------------------------------------------------------------------- by hand (one client, full-batch SGD)
def test_feddc_client_step_drift_and_correction_by_hand(data: ImageSet) -> None:
    """FedDC's client (Gao et al., CVPR 2022; Chen & Vikalo, ICML 2024, Eq.
    81-82): the local objective ``L_k(θ) + α/2 ||θ + d_k - w||² + <θ, (Δθ_k -
    ΔΘ)/(eta K)>`` has gradient ``g(w) + α d_k + (Δθ_k - ΔΘ)/(eta K)`` at the
    global weights; after the step the drift grows by the local update,
    ``d_k <- d_k + (θ_k - w)``, and the update is kept for the next round."""
    run = hand_run()
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
