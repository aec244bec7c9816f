"""The client-ensemble teacher: exact weighting (uniform, data size, learned, class-level)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.kd.coboosting import boost_ensemble_weights
from osfl.methods.kd.pool import SyntheticPool
from osfl.methods.kd.teacher import EnsembleTeacher


class Const(nn.Module):
    """Returns fixed logits for every input (plus 0 · x so that input gradients exist)."""

    def __init__(self, logits: list[float]):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1) + 0 * x.flatten(1).sum(1, keepdim=True)


def members() -> list[nn.Module]:
    return [Const([1.0, 0.0, 0.0]), Const([0.0, 2.0, 0.0]), Const([0.0, 0.0, 4.0])]


X = torch.zeros(2, 1, 2, 2)


def test_uniform_weights_average_logits_exactly() -> None:
    t = EnsembleTeacher(members())
    assert torch.allclose(t(X), torch.tensor([[1 / 3, 2 / 3, 4 / 3]] * 2))


def test_data_size_weights() -> None:
    t = EnsembleTeacher.from_counts(members(), [10, 30, 60], "data_size")
    assert torch.allclose(t.weights, torch.tensor([0.1, 0.3, 0.6]))
    assert torch.allclose(t(X)[0], torch.tensor([0.1, 0.6, 2.4]))
    assert torch.allclose(
        EnsembleTeacher.from_counts(members(), [10, 30, 60])(X), EnsembleTeacher(members())(X)
    )


def test_learned_weights_are_normalised_at_use() -> None:
    t = EnsembleTeacher(members(), [2.0, 0.0, 2.0])
    assert torch.allclose(t(X)[0], torch.tensor([0.5, 0.0, 2.0]))
    t.set_weights(torch.tensor([0.0, 1.0, 0.0]))
    assert torch.allclose(t(X)[0], torch.tensor([0.0, 2.0, 0.0]))
    for bad in ([1.0, 2.0], [-1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [float("nan"), 1.0, 1.0]):
        with pytest.raises(ConfigError):
            t.set_weights(bad)


def test_class_level_weights_follow_labels() -> None:
    # client k's share of class y; class 2 is held by nobody -> falls back to uniform
    cw = torch.tensor([[1.0, 1.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    t = EnsembleTeacher(members(), class_weights=cw)
    out = t(torch.zeros(3, 1, 2, 2), torch.tensor([0, 1, 2]))
    assert torch.allclose(out[0], torch.tensor([1.0, 0.0, 0.0]))  # only client 0 holds class 0
    assert torch.allclose(out[1], torch.tensor([0.25, 1.5, 0.0]))  # 1/4, 3/4
    assert torch.allclose(out[2], torch.tensor([1 / 3, 2 / 3, 4 / 3]))
    assert torch.allclose(t(X), EnsembleTeacher(members())(X))  # no labels: plain weights


def test_probability_combine_returns_log_of_the_mixture() -> None:
    t = EnsembleTeacher(members(), [1.0, 3.0, 0.0], combine="probs")
    probs = [torch.softmax(m(X)[0], -1) for m in members()]
    mix = 0.25 * probs[0] + 0.75 * probs[1]
    assert torch.allclose(t(X)[0].exp(), mix, atol=1e-6)


def test_members_are_frozen_but_inputs_get_gradients() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    t = EnsembleTeacher([model])
    t.train()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    x = torch.randn(2, 1, 2, 2, requires_grad=True)
    t(x).sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    with pytest.raises(ConfigError):
        EnsembleTeacher([])
    with pytest.raises(ConfigError):
        EnsembleTeacher(members(), combine="median")


def test_coboosting_weight_update_moves_towards_the_right_client() -> None:
    # samples labelled 2: only client 2 predicts class 2, so its weight must grow
    t = EnsembleTeacher(members())
    pool = SyntheticPool()
    pool.add(torch.zeros(8, 1, 2, 2), torch.full((8,), 2))
    w = boost_ensemble_weights(t, pool, 0.1, batch_size=4)
    assert w[2] > w[0] and w[2] > w[1]
    assert torch.allclose(w, torch.tensor([1 / 3 - 0.2, 1 / 3 - 0.2, 1 / 3 + 0.2]), atol=1e-6)
    assert torch.equal(t.weights, w)
