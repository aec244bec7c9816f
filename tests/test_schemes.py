"""SCAFFOLD, FedDyn, FedDC: objective terms by hand, server updates by hand,
exact reduction to FedAvg when the extra terms are off, and learning on digits."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.method import METHODS
from osfl.fl.objectives import (
    OBJECTIVE_TERMS,
    FedDCTerm,
    FedDynTerm,
    ScaffoldCorrection,
    effective_lr_sum,
)
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.fl.upload import Upload
from osfl.methods.schemes import SchemeState

# --------------------------------------------------------------------------- helpers


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.Tanh(), nn.Linear(5, 3))


def tiny_data(n: int = 12) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 3, classes=("a", "b", "c"))


def named(model: nn.Module, fill: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(p, fill) for k, p in model.named_parameters()}


def one_full_batch_step(model: nn.Module, terms, **cfg) -> None:
    cfg = {"steps": 1, "batch_size": 12, "lr": 0.5, "optimizer": "sgd", **cfg}
    train_local(model, tiny_data(), TrainConfig(**cfg), terms=terms)


def ce_grad(model: nn.Module) -> dict[str, torch.Tensor]:
    data = tiny_data()
    model.zero_grad()
    F.cross_entropy(model(data.images.float() / 255), data.labels).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


# --------------------------------------------------------------------------- terms
def test_terms_are_registered() -> None:
    for name, cls in [
        ("scaffold", ScaffoldCorrection),
        ("feddyn", FedDynTerm),
        ("feddc", FedDCTerm),
    ]:
        assert OBJECTIVE_TERMS.get(name) is cls


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


def test_effective_lr_sum() -> None:
    assert effective_lr_sum([0.1] * 4) == pytest.approx(0.4)
    # heavy ball, 2 steps: g1 acts with eta (1 + gamma), g2 with eta
    assert effective_lr_sum([1.0, 1.0], momentum=0.5) == pytest.approx(1.5 + 1.0)
    # Nesterov, 2 steps: g1 -> 1 + .5 * 1.5, g2 -> 1 + .5 * 1
    assert effective_lr_sum([1.0, 1.0], 0.5, nesterov=True) == pytest.approx(1.75 + 1.5)


@pytest.mark.parametrize("optimizer", ["sgdm", "nesterov"])
def test_effective_lr_sum_recovers_a_constant_gradient(optimizer: str) -> None:
    """With a constant gradient g, (x - y) / effective_lr_sum == g for every optimizer."""
    p = nn.Parameter(torch.zeros(3))
    cfg = TrainConfig(optimizer=optimizer, lr=0.1, momentum=0.9)
    from osfl.fl.optim import build_optimizer

    opt = build_optimizer([p], cfg)
    g = torch.tensor([1.0, -2.0, 0.5])
    for _ in range(7):
        p.grad = g.clone()
        opt.step()
    d = effective_lr_sum([0.1] * 7, 0.9, nesterov=optimizer == "nesterov")
    torch.testing.assert_close(-p.detach() / d, g)


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


def test_terms_off_add_nothing() -> None:
    w = tiny_model()
    for term in (
        ScaffoldCorrection(None, None),
        FedDynTerm(dict(w.named_parameters()), None, 0.0),
        FedDCTerm(dict(w.named_parameters()), None, None, 0.0),
    ):
        plain, with_term = tiny_model(), tiny_model()
        one_full_batch_step(plain, [])
        one_full_batch_step(with_term, [term])
        for a, b in zip(plain.parameters(), with_term.parameters(), strict=True):
            assert torch.equal(a, b)


def test_terms_refuse_mismatched_state() -> None:
    model = tiny_model()
    bad = {k: torch.zeros(2) for k, _ in model.named_parameters()}
    with pytest.raises(ConfigError, match="shape"):
        ScaffoldCorrection(bad, None).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="lacks parameter"):
        FedDynTerm({}, None, 0.1).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="alpha"):
        FedDCTerm({}, None, None, -1.0)


# --------------------------------------------------------------------------- methods
@pytest.fixture(scope="module")
def digits() -> tuple[ImageSet, ImageSet, Any]:
    from osfl.data.partition import make_federation
    from osfl.data.sources import load_data

    splits = load_data("digits", image_size=16, max_per_class=40)
    fed = make_federation(splits.train.labels, "dirichlet", 5, 0, alpha=1.0, num_classes=10)
    return splits.train, splits.test, fed


def make_run(train: ImageSet, num_clients: int, **train_cfg: Any) -> RunContext:
    from osfl.data.transforms import build_transform

    cfg = {"epochs": 1, "batch_size": 16, "lr": 0.05, "optimizer": "sgd", **train_cfg}
    tf = build_transform("none", image_size=16, mean=(0.5,), std=(0.5,))
    return RunContext(
        num_classes=10,
        image_shape=train.image_shape,
        num_clients=num_clients,
        model=ModelSpec("cnn_small", {"in_chans": 1, "img_size": 16}),
        train=TrainConfig(**cfg),
        train_transform=tf,
        eval_transform=tf,
        seed=0,
    )


def simulate(name: str, options: dict, train: ImageSet, fed: Any, run: RunContext, test=None):
    from osfl.config import method_config
    from osfl.fl.evaluate import evaluate

    cls = METHODS.get(name)
    method = cls(method_config(cls, options), run)
    evaluator = None
    if test is not None:

        def evaluator(pred):
            return evaluate(pred, test, run.eval_transform, run.device).as_dict()

    result = run_simulation(method, run, train, fed, evaluator=evaluator)
    return method, result


@pytest.mark.parametrize(
    ("name", "off"),
    [
        ("scaffold", {"option": "none"}),
        ("feddyn", {"alpha": 0.0}),
        ("feddc", {"alpha": 0.0, "drift": False, "correction": False}),
    ],
)
def test_reduces_to_fedavg_when_the_extra_term_is_off(digits, name: str, off: dict) -> None:
    train, _, fed = digits
    run = make_run(train, 5)
    common = {"rounds": 2, "weighting": "uniform"}
    _, ref = simulate("fedavg", common, train, fed, run)
    _, got = simulate(name, {**common, **off}, train, fed, run)
    assert ref.state.keys() == got.state.model.keys()
    for k, v in ref.state.items():
        torch.testing.assert_close(got.state.model[k], v, rtol=0, atol=1e-7)


_FEDAVG: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("name", "opts", "optimizer"),
    [
        *[
            (n, o, opt)
            for n, o in [("scaffold", {}), ("feddyn", {"alpha": 0.1}), ("feddc", {})]
            for opt in ("sgd", "sgdm", "nesterov")
        ],
        ("scaffold", {"option": "I"}, "sgdm"),
    ],
)
def test_each_scheme_runs_with_each_optimizer(digits, name, opts, optimizer) -> None:
    train, _, fed = digits
    run = make_run(train, 5, optimizer=optimizer, lr=0.02)
    method, res = simulate(name, {"rounds": 2, **opts}, train, fed, run)
    assert isinstance(res.state, SchemeState)
    for v in res.state.model.values():
        assert torch.isfinite(v.float()).all()
    if optimizer not in _FEDAVG:
        _FEDAVG[optimizer] = simulate(
            "fedavg", {"rounds": 2, "weighting": "uniform"}, train, fed, run
        )[1]
    ref = _FEDAVG[optimizer]
    diff = max(float((res.state.model[k] - v).abs().max()) for k, v in ref.state.items())
    assert diff > 1e-6  # the scheme's term changed training (SCAFFOLD: from round 1 on)
    hp = method.public_hparams()
    assert hp["fl"]["scheme"] == name and hp["train"]["optimizer"] == optimizer


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


def _fake_uploads(method, state: SchemeState, deltas: dict[int, float], n: dict[int, int]):
    names = method.param_names()
    ups = {}
    for c, d in deltas.items():
        t = {k: v.clone() for k, v in state.model.items()}
        for k in names:
            t[k] = t[k] + d
        ups[c] = Upload(tensors=t, meta={"num_samples": n[c]})
    return ups


def test_feddyn_server_update_by_hand(digits) -> None:
    train, _, _ = digits
    run = make_run(train, 4)
    cls = METHODS.get("feddyn")
    alpha = 0.5
    method = cls(cls.Config(alpha=alpha), run)
    s0 = method.init_state()
    ups = _fake_uploads(method, s0, {0: 0.1, 1: 0.3}, {0: 10, 1: 30})
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


def _feddc_after_one_round(digits) -> tuple[Any, Any, Any, Any, Any, str]:
    """FedDC (α 0.1, lr 0.1, 2 local steps) after one round of two fake
    uploads that moved every weight by 0.1 and 0.3: (cls, run, method, s0, s1, key)."""
    train, _, _ = digits
    run = make_run(train, 2, epochs=1, batch_size=8, lr=0.1)
    cls = METHODS.get("feddc")
    method = cls(cls.Config(alpha=0.1), run)
    s0 = method.init_state()
    s1 = method.aggregate(s0, _fake_uploads(method, s0, {0: 0.1, 1: 0.3}, {0: 16, 1: 16}), 0)
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


def test_scheme_configs_refuse_bad_values() -> None:
    for name, bad in [
        ("scaffold", {"option": "III"}),
        ("scaffold", {"server_lr": 0.0}),
        ("feddyn", {"alpha": -0.1}),
        ("feddc", {"alpha": -1.0}),
        ("feddc", {"rounds": 0}),
    ]:
        with pytest.raises(ConfigError):
            METHODS.get(name).Config(**bad)


def test_checkpointable_state(digits) -> None:
    train, _, fed = digits
    run = make_run(train, 5)
    _, res = simulate("feddc", {"rounds": 1}, train, fed, run)
    flat = res.state.state_dict()
    assert any(k.startswith("model.") for k in flat)
    assert any(k.startswith("clients.0.drift.") for k in flat)


@pytest.mark.parametrize("name", ["scaffold", "feddyn", "feddc"])
def test_multi_round_learns_on_digits(digits, name: str) -> None:
    train, test, fed = digits
    run = make_run(train, 5, epochs=2, optimizer="nesterov", lr=0.02)
    _, res = simulate(name, {"rounds": 3}, train, fed, run, test=test)
    acc = res.metrics["global_test_accuracy"]
    assert acc > 0.4, f"{name} reached {acc:.3f} on digits (chance 0.1)"
    assert np.isfinite(acc)
