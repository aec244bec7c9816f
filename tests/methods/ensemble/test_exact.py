"""The Ensemble's predictor, exactly: the weighted mean of its members' softmax
probabilities, weights normalised, and one clear refusal per bad weighting
(tests that mutation testing showed were missing: TESTING.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from osfl.methods.ensemble import EnsemblePredictor


class Fixed(nn.Module):
    """A member that answers the same logits for every input."""

    def __init__(self, logits: list[float], dtype: torch.dtype = torch.float32):
        super().__init__()
        self.logits = torch.tensor(logits, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(x), -1)


MEMBERS = ([0.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 0.0, 5.0])


def probs(logits: list[float]) -> torch.Tensor:
    return torch.softmax(torch.tensor(logits), dim=-1)


def test_uniform_weights_average_the_members_probabilities() -> None:
    pred = EnsemblePredictor([Fixed(m) for m in MEMBERS])
    out = pred(torch.zeros(2, 1))
    want = sum(probs(m) for m in MEMBERS) / 3
    torch.testing.assert_close(out, want.expand(2, -1), rtol=0, atol=1e-7)
    torch.testing.assert_close(pred.weights, torch.full((3,), 1 / 3), rtol=0, atol=0)
    assert "weights" in dict(pred.named_buffers())  # saved and moved with the predictor


def test_given_weights_are_normalised_and_mix_the_probabilities() -> None:
    pred = EnsemblePredictor([Fixed(m, torch.float64) for m in MEMBERS], weights=[1, 0, 3])
    torch.testing.assert_close(pred.weights, torch.tensor([0.25, 0.0, 0.75]), rtol=0, atol=0)
    out = pred(torch.zeros(1, 1))
    assert out.dtype == torch.float32  # members' logits are read in float32
    torch.testing.assert_close(out[0], 0.25 * probs(MEMBERS[0]) + 0.75 * probs(MEMBERS[2]))


@pytest.mark.parametrize("weights", [[1.0, 2.0], [1.0, -1.0, 1.0], [0.0, 0.0, 0.0]])
def test_bad_weights_are_refused(weights) -> None:
    with pytest.raises(
        ValueError, match=r"^ensemble weights must be one non-negative number per model$"
    ):
        EnsemblePredictor([Fixed(m) for m in MEMBERS], weights=weights)


def test_an_empty_ensemble_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^an ensemble needs at least one model$"):
        EnsemblePredictor([])
