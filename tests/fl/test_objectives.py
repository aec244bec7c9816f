"""Objective terms: FedProx's proximal term and the hook protocol (osfl.fl.objectives)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.objectives import OBJECTIVE_TERMS, ObjectiveTerm, ProximalTerm
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.ReLU(), nn.Linear(6, 3))


def make_data(n: int = 24) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 3, classes=("a", "b", "c"))


def train(model: nn.Module, terms=(), **cfg) -> nn.Module:
    cfg = {"epochs": 2, "batch_size": 8, "lr": 0.1, **cfg}
    train_local(
        model,
        make_data(),
        TrainConfig(**cfg),
        generator=torch.Generator().manual_seed(1),
        terms=terms,
    )
    return model


def test_registry() -> None:
    assert OBJECTIVE_TERMS.get("proximal") is ProximalTerm
    assert ProximalTerm(make_model(), mu=0.5).key() == {"name": "proximal", "mu": 0.5}


def test_proximal_value_and_gradient_are_exact() -> None:
    global_model = make_model(seed=0)
    model = make_model(seed=1)
    mu = 0.25  # a power of two: mu/2 * 2 * (w - w_g) is exact in floating point
    term = ProximalTerm(global_model, mu=mu)
    term.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = term.extra_loss(model)
    assert loss is not None
    pairs = list(zip(model.parameters(), global_model.parameters(), strict=True))
    by_hand = 0.5 * mu * sum(float(((p - g) ** 2).sum().detach()) for p, g in pairs)
    assert float(loss.detach()) == pytest.approx(by_hand, rel=1e-6)
    loss.backward()
    for p, g in pairs:
        assert torch.equal(p.grad, mu * (p.detach() - g.detach()))


def test_mu_zero_equals_plain_training() -> None:
    init = make_model(seed=0)
    plain = train(make_model(seed=0))
    prox0 = train(make_model(seed=0), terms=[ProximalTerm(init, mu=0.0)])
    assert ProximalTerm(init, mu=0.0).extra_loss(init) is None
    for a, b in zip(plain.state_dict().values(), prox0.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_proximal_term_keeps_weights_near_the_global_model() -> None:
    init = make_model(seed=0)

    def drift(model: nn.Module) -> float:
        params = zip(model.parameters(), init.parameters(), strict=True)
        return sum(float(((p - g) ** 2).sum().detach()) for p, g in params)

    free = drift(train(make_model(seed=0), lr=0.5, epochs=4))
    held = drift(train(make_model(seed=0), terms=[ProximalTerm(init, mu=1.0)], lr=0.5, epochs=4))
    assert 0 < held < 0.5 * free


def test_proximal_refuses_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="mu must be >= 0"):
        ProximalTerm(make_model(), mu=-1.0)
    partial = {"1.weight": torch.zeros(6, 16)}
    with pytest.raises(ConfigError, match=r"lack parameter '1\.bias'"):
        ProximalTerm(partial, mu=1.0).setup(
            make_model(), torch.optim.SGD(make_model().parameters(), lr=1)
        )
    wrong = dict(make_model().named_parameters()) | {"1.bias": torch.zeros(5)}
    with pytest.raises(ConfigError, match="shape"):
        ProximalTerm(wrong, mu=1.0).setup(
            make_model(), torch.optim.SGD(make_model().parameters(), lr=1)
        )


class Recorder(ObjectiveTerm):
    """Logs every hook call and what the gradients look like at before_step."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("setup")

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        self.calls.append("extra_loss")
        return None

    def before_step(self, model: nn.Module) -> None:
        self.calls.append("before_step")
        assert all(p.grad is not None for p in model.parameters())

    def after_step(self, model: nn.Module) -> None:
        self.calls.append("after_step")


def test_hook_order() -> None:
    rec = Recorder()
    train(make_model(), terms=[rec], epochs=1, steps=2)
    assert rec.calls == ["setup"] + ["extra_loss", "before_step", "after_step"] * 2


class ZeroGrad(ObjectiveTerm):
    """A gradient correction (SCAFFOLD-style) that cancels the whole gradient."""

    def before_step(self, model: nn.Module) -> None:
        for p in model.parameters():
            p.grad.zero_()


def test_before_step_corrects_the_gradient_used_by_the_optimizer() -> None:
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, terms=[ZeroGrad()], optimizer="sgd")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_extra_loss_is_added() -> None:
    class Constant(ObjectiveTerm):
        def extra_loss(self, model: nn.Module) -> torch.Tensor:
            return torch.tensor(100.0)

    data = make_data()
    a = train_local(make_model(), data, TrainConfig(steps=3, batch_size=8), terms=[Constant()])
    b = train_local(make_model(), data, TrainConfig(steps=3, batch_size=8))
    assert a.mean_loss == pytest.approx(b.mean_loss + 100.0, rel=1e-6)
