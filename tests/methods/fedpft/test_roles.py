"""FedPFT roles: every (client, class) mixture is sampled with its own noise,
and the head reads the global token.

The server draws n_c features from each (client, class) mixture
(``FedPFT.synthetic_features``). Two clients that sent the same class-c
mixture are still two independent sources: a generator shared by the
clients would draw the same noise for both, so the synthetic set would hold
every such feature twice (Flower's ``aggregate_fit`` reuses one
``random_state`` for every mixture and so does repeat it; osfl seeds each
(client, class) draw on its own). The official drop rule keeps only classes with
more than K samples: with K components a class of exactly K samples would be
memorised, so it is dropped too. The head is trained on draws of the global token
(position 0 of the encoder's sequence), so at test time it must read that
position and no other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from osfl.config import method_config
from osfl.data.federation import Federation
from osfl.fl.context import ClientContext
from osfl.fl.upload import Upload
from osfl.methods.fedpft import FedPFT, LinearTokenHead
from support.tiny import FAST_FEDPFT, seed_ctx


def test_two_clients_with_the_same_mixture_get_independent_draws(tiny: Any) -> None:
    """Clients 0 and 1 send the same one-component class-3 mixture (mean 1,
    variance 4, D = 2) for 5 samples each: 10 draws labelled 3, every one a
    different value (a seed shared by the clients repeats client 0's five)."""
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    d = m.token_dim()
    rows = torch.cat([torch.ones(1, 1), torch.ones(1, d), torch.full((1, d), 4.0)], 1).half()
    counts = [0] * 10
    counts[3] = 5
    up = Upload(tensors={"gmm.3": rows}, meta={"num_samples": 5, "class_counts": counts})
    x, y = m.synthetic_features({0: up, 1: up})
    assert y.tolist() == [3] * 10
    assert x.shape == (10, d)
    assert not torch.equal(x[:5], x[5:])
    assert len({tuple(r.tolist()) for r in x}) == 10


def test_the_head_reads_the_global_token() -> None:
    """A head with weight I and bias 0 on D = 2: token 0 = (2, 5) scores (2, 5);
    the patch tokens (10, 20) and (-1, -1) would score themselves."""
    head = LinearTokenHead(2, 2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.eye(2))
        head.linear.bias.zero_()
    tokens = torch.tensor([[[2.0, 5.0], [10.0, 20.0], [-1.0, -1.0]]])
    assert head(tokens).tolist() == [[2.0, 5.0]]
    assert head(torch.tensor([[2.0, 5.0]])).tolist() == [[2.0, 5.0]]


def test_drop_skips_a_class_of_exactly_k_samples(tiny: Any) -> None:
    """K = 4 components; client 0 holds 5 of class 2, exactly 4 of class 7
    and 1 of class 3. ``drop`` (Flower's learn_gmm: n_c > K only) sends class 2
    alone; ``fewer`` sends all three, class 7 with 4 components."""
    _, splits = tiny
    labels = splits.train.labels.numpy()
    mine = np.concatenate(
        [
            np.flatnonzero(labels == 2)[:5],
            np.flatnonzero(labels == 7)[:4],
            np.flatnonzero(labels == 3)[:1],
        ]
    )
    rest = np.setdiff1d(np.arange(len(labels)), mine)
    fed = Federation.from_indices(
        labels,
        [np.sort(mine), rest[::2], rest[1::2]],
        scheme="manual",
        params={},
        seed=0,
        num_classes=10,
        data_fingerprint=splits.train.fingerprint(),
    )
    ctx = seed_ctx(tiny, fed)
    data = ctx.splits.train.subset(np.sort(mine))
    sent = {}
    for rule in ("drop", "fewer"):
        m = FedPFT(method_config(FedPFT, {**FAST_FEDPFT, "small_classes": rule}), ctx.run)
        cctx = ClientContext(ctx.run, 0, 0, torch.Generator())
        up = m.client_update(cctx, m.broadcast(m.init_state(), 0), data)
        sent[rule] = {k: tuple(v.shape) for k, v in up.tensors.items()}
    d = 1 + 2 * m.token_dim()
    assert sent["drop"] == {"gmm.2": (4, d)}
    assert sent["fewer"] == {"gmm.2": (4, d), "gmm.7": (4, d), "gmm.3": (1, d)}
