"""Evaluation with hand-made predictors whose accuracies are known exactly
(osfl.fl.evaluate)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, DataError
from osfl.fl.evaluate import EvalResult, evaluate, local_test_accuracy
from osfl.fl.method import PerClientPredictor

K = 3


def make_test() -> ImageSet:
    """10 samples: labels 0,0,0,0,0,1,1,1,2,2; pixel (0,0,0) stores the label."""
    labels = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
    images = torch.zeros(10, 1, 2, 2, dtype=torch.uint8)
    images[:, 0, 0, 0] = labels.to(torch.uint8)
    return ImageSet(images=images, labels=labels, classes=("a", "b", "c"))


class Oracle(nn.Module):
    """Reads the label from pixel (0,0,0) (inputs scaled by 1/255): always right."""

    def __init__(self, wrong_class: int | None = None):
        super().__init__()
        self.wrong_class = wrong_class
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        y = (x[:, 0, 0, 0] * 255).round().long()
        if self.wrong_class is not None:  # ... except on one class, predicted as the next
            y = torch.where(y == self.wrong_class, (y + 1) % K, y)
        return nn.functional.one_hot(y, K).float()


class Constant(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(torch.full((x.shape[0],), self.c), K).float() * 5


def test_oracle_and_constant_accuracy() -> None:
    test = make_test()
    r = evaluate(Oracle(), test)
    assert isinstance(r, EvalResult)
    assert (r.accuracy, r.per_class_accuracy, r.num_samples) == (1.0, (1.0, 1.0, 1.0), 10)
    c = evaluate(Constant(0), test, batch_size=3)  # batches of 3, 3, 3, 1
    assert c.accuracy == 0.5 and c.per_class_accuracy == (1.0, 0.0, 0.0)
    w = evaluate(Oracle(wrong_class=1), test, batch_size=4)
    assert w.accuracy == pytest.approx(0.7) and w.per_class_accuracy == (1.0, 0.0, 1.0)


def test_transform_is_applied() -> None:
    seen: list[object] = []

    def blank(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        seen.append(generator)
        return x.float() * 0  # the oracle now reads label 0 everywhere

    r = evaluate(Oracle(), make_test(), transform=blank, batch_size=4)
    assert r.accuracy == 0.5 and r.per_class_accuracy == (1.0, 0.0, 0.0)
    assert seen == [None, None, None]  # evaluation draws no random numbers


def test_as_dict_names_global_accuracy() -> None:
    d = evaluate(Constant(1), make_test()).as_dict()
    assert d == {
        "global_test_accuracy": 0.3,
        "per_class_accuracy": [0.0, 1.0, 0.0],
        "num_samples": 10,
    }
    json.dumps(d)


def test_eval_mode_and_restore() -> None:
    model = Oracle()
    model.train()
    evaluate(model, make_test(), batch_size=4)
    assert model.modes == [False, False, False] and model.training
    with torch.enable_grad():
        params = nn.Linear(4, K)
        out = evaluate(nn.Sequential(nn.Flatten(), params), make_test())
    assert 0.0 <= out.accuracy <= 1.0 and params.weight.grad is None


def test_per_client_predictor() -> None:
    r = evaluate(PerClientPredictor([Oracle(), Constant(0), Constant(2)]), make_test())
    assert r.client_accuracies == (1.0, 0.5, 0.2)
    assert r.mean_client_accuracy == pytest.approx(1.7 / 3) and r.accuracy == r.mean_client_accuracy
    assert r.per_class_accuracy == pytest.approx((2 / 3, 1 / 3, 2 / 3))
    d = r.as_dict()
    assert d["client_accuracies"] == [1.0, 0.5, 0.2] and "mean_client_accuracy" in d


def test_absent_class_is_none() -> None:
    labels = torch.tensor([0, 0, 1])
    images = torch.zeros(3, 1, 2, 2, dtype=torch.uint8)
    images[:, 0, 0, 0] = labels.to(torch.uint8)
    test = ImageSet(images=images, labels=labels, classes=("a", "b", "c"))
    assert evaluate(Oracle(), test).per_class_accuracy == (1.0, 1.0, None)


def test_refuses_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="expected \\(B, 3\\)"):
        evaluate(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), make_test())
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate(Oracle(), make_test(), batch_size=0)
    empty = ImageSet(
        images=torch.zeros(0, 1, 2, 2, dtype=torch.uint8),
        labels=torch.zeros(0, dtype=torch.int64),
        classes=("a", "b", "c"),
    )
    with pytest.raises(DataError, match="empty"):
        evaluate(Oracle(), empty)
    with pytest.raises(ConfigError, match="no models"):
        evaluate(PerClientPredictor([]), make_test())


def test_local_test_accuracy_by_hand() -> None:
    test = make_test()
    counts = np.array([[10, 0, 0], [0, 5, 5], [1, 1, 0], [2, 1, 1]])
    # one shared predictor (constant class 0): per-class accuracy (1, 0, 0)
    assert local_test_accuracy(Constant(0), test, counts) == [1.0, 0.0, 0.5, 0.5]
    # one model per client
    models = [Constant(0), Oracle(wrong_class=2), Constant(1), Oracle()]
    got = local_test_accuracy(models, test, counts)
    assert got == pytest.approx([1.0, 0.5, 0.5, 1.0])
    assert local_test_accuracy(PerClientPredictor(models), test, counts) == got


def test_local_test_accuracy_renormalises_over_test_classes() -> None:
    labels = torch.tensor([0, 1])
    images = torch.zeros(2, 1, 2, 2, dtype=torch.uint8)
    images[:, 0, 0, 0] = labels.to(torch.uint8)
    test = ImageSet(images=images, labels=labels, classes=("a", "b", "c"))
    # class 2 is absent from the test set: the client's weight on it is dropped
    assert local_test_accuracy(Constant(0), test, [[1, 1, 8]]) == [0.5]
    with pytest.raises(DataError, match="client 0 has no training samples"):
        local_test_accuracy(Constant(0), test, [[0, 0, 8]])


def test_local_test_accuracy_refuses_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="clients × 3 classes"):
        local_test_accuracy(Constant(0), make_test(), [[1, 2]])
    with pytest.raises(ConfigError, match="2 client models but class_counts has 1"):
        local_test_accuracy([Constant(0), Constant(1)], make_test(), [[1, 2, 3]])
    with pytest.raises(ConfigError, match="non-negative"):
        local_test_accuracy(Constant(0), make_test(), [[1, -2, 3]])
