"""FedCGS roles: the head reads the global token, not a patch token.

The statistics are built from each image's global (class) token, position 0
of the encoder's sequence (``FedCGS.client_update`` takes ``[:, 0]``); the
head must score the same position. Every other token here is distinguishable,
so reading any of them gives a different, hand-checked-wrong answer.
"""

from __future__ import annotations

import torch

from osfl.methods.fedcgs import GaussianHead


def test_the_head_scores_the_global_token_of_a_sequence() -> None:
    """W = I, b = (0.5, -0.5): token 0 = (2, 5) scores (2.5, 4.5); the
    patch tokens (10, 20) and (-1, -1) would score (10.5, 19.5) and (-0.5, -1.5)."""
    head = GaussianHead(torch.eye(2), torch.tensor([0.5, -0.5]))
    tokens = torch.tensor([[[2.0, 5.0], [10.0, 20.0], [-1.0, -1.0]]])
    assert head(tokens).tolist() == [[2.5, 4.5]]
    # a (B, D) input is already the global feature
    assert head(torch.tensor([[2.0, 5.0]])).tolist() == [[2.5, 4.5]]
