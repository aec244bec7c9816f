"""``Evaluator``: a job's scores from concrete parts (test set, transform,
device; validation set and clients' class counts only when given)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.fl.evaluate import Evaluator, evaluate, local_test_accuracy


class _Fixed(nn.Module):
    """Predicts class 0 for every input (per-class accuracy: 1 for class 0, else 0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), 3)
        out[:, 0] = 1.0
        return out


def _set(labels: list[int]) -> ImageSet:
    images = torch.zeros(len(labels), 1, 2, 2, dtype=torch.uint8)
    return ImageSet(images, torch.tensor(labels), ("a", "b", "c"))


def test_scores_are_the_test_sets_and_add_only_what_is_given() -> None:
    test, val = _set([0, 0, 1, 2]), _set([0, 1])
    model = _Fixed()
    plain = Evaluator(test, None, "cpu")(model)
    assert plain == evaluate(model, test).as_dict()
    assert plain["global_test_accuracy"] == pytest.approx(0.5)
    assert "validation_accuracy" not in plain and "local_test_accuracy" not in plain

    counts = np.array([[4, 0, 0], [0, 2, 2]])
    full = Evaluator(test, None, "cpu", validation=val, local_counts=counts)(model)
    assert full["validation_accuracy"] == pytest.approx(0.5)
    assert full["local_test_accuracies"] == local_test_accuracy(model, test, counts)
    assert full["local_test_accuracies"] == pytest.approx([1.0, 0.0])
    assert full["local_test_accuracy"] == pytest.approx(0.5)
