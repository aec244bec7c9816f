"""FedCGS roles: the head reads the global token, not a patch token.

The statistics are built from each image's global (class) token, position 0
of the encoder's sequence (``FedCGS.client_update`` takes ``[:, 0]``); the
head must score the same position. Every other token here is distinguishable,
so reading any of them gives a different, hand-checked-wrong answer. The
class counts a client declares must add up to the sample count the server
bounds.
"""

from __future__ import annotations

import pytest
import torch

from osfl.config import method_config
from osfl.errors import UploadError
from osfl.fl.upload import Upload, validate
from osfl.methods.fedcgs import FedCGS, GaussianHead
from support.tiny import split_ctx


def test_the_head_scores_the_global_token_of_a_sequence() -> None:
    """W = I, b = (0.5, -0.5): token 0 = (2, 5) scores (2.5, 4.5); the
    patch tokens (10, 20) and (-1, -1) would score (10.5, 19.5) and (-0.5, -1.5)."""
    head = GaussianHead(torch.eye(2), torch.tensor([0.5, -0.5]))
    tokens = torch.tensor([[[2.0, 5.0], [10.0, 20.0], [-1.0, -1.0]]])
    assert head(tokens).tolist() == [[2.5, 4.5]]
    # a (B, D) input is already the global feature
    assert head(torch.tensor([[2.0, 5.0]])).tolist() == [[2.5, 4.5]]


def test_the_class_counts_a_client_declares_must_add_up_to_its_sample_count(tiny) -> None:
    """``class_counts`` is a claim a client makes about itself, and it weighs
    the client's class sums in the global statistics; the server holds it to
    the other claim it bounds (``num_samples``: at most the partition size or
    ``server.max_num_samples``). One count too many, in any class, is refused
    naming the field; the exact histogram passes."""
    ctx = split_ctx(tiny, 3, 0.5)
    m = FedCGS(method_config(FedCGS), ctx.run)
    spec = m.upload_spec({}, 0, 1)
    tensors = {k: torch.zeros(t.shape, dtype=t.dtype) for k, t in spec.tensors.items()}
    k = ctx.run.num_classes
    counts = [3, 0, 5] + [1] * (k - 3)
    n = sum(counts)
    validate(Upload(tensors, {"num_samples": n, "class_counts": counts}), spec, client=1)
    for c in (0, 1, k - 1):  # one extra sample claimed in the first, a middle, the last class
        inflated = [v + (i == c) for i, v in enumerate(counts)]
        with pytest.raises(UploadError, match=r"meta\.class_counts.*sums to"):
            validate(Upload(tensors, {"num_samples": n, "class_counts": inflated}), spec, client=1)
