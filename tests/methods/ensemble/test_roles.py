"""Ensemble roles: after the server keeps a subset of the clients, each kept
client's sample count weighs that client's own model (Guha et al., 2019;
``weighting=data_size``: ``n_k / Σ n``).

The uploads arrive in a scrambled order (a transport does not sort them),
one client is missing (refused on the way in) at the first, a middle or the
last position, and one more carries an unusable count and is dropped by the
server; every kept client has its own sample count and its own weights, so
a weight read by arrival order, or shifted by one after the drop, gives
another mixture than the one computed here by client id.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.fl.upload import Upload
from osfl.methods.clients import initial_state
from support.smoke import smoke_config, smoke_context

#: client -> its sample count (all different)
COUNTS = {0: 5, 1: 40, 2: 12, 3: 90, 4: 27}
#: the order in which the uploads arrive
ARRIVAL = (3, 0, 4, 2, 1)


@pytest.fixture(scope="module")
def run() -> Any:
    return smoke_context(smoke_config("ensemble")).run


def _upload(base: dict[str, torch.Tensor], c: int, n: Any) -> Upload:
    g = torch.Generator().manual_seed(100 + c)
    tensors = {
        k: v + 0.5 * torch.randn(v.shape, generator=g)
        if v.is_floating_point() and "running" not in k  # BN statistics stay valid
        else v
        for k, v in base.items()
    }
    return Upload(tensors=tensors, meta={"num_samples": n})


@pytest.mark.parametrize("refused", [0, 2, 4])
def test_each_kept_client_s_count_weighs_its_own_model(run: Any, refused: int) -> None:
    cls = METHODS.get("ensemble")
    method = cls(method_config(cls, {"weighting": "data_size"}), run)
    base = initial_state(run)
    unusable = 1 if refused != 1 else 3  # dropped by the server: no usable count
    uploads = {
        c: _upload(base, c, 0 if c == unusable else COUNTS[c]) for c in ARRIVAL if c != refused
    }
    state = method.aggregate(method.init_state(), uploads, 0)
    kept = sorted(c for c in COUNTS if c not in (refused, unusable))
    assert sorted(state["clients"]) == kept

    predictor = method.predictor(state).eval()
    total = sum(COUNTS[c] for c in kept)
    want_w = torch.tensor([COUNTS[c] / total for c in kept])
    torch.testing.assert_close(predictor.weights, want_w)
    x = torch.rand(6, *run.image_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        probs = {c: _probs(method, uploads[c].tensors, x) for c in kept}
        want = sum(COUNTS[c] / total * probs[c] for c in kept)
        got = predictor(x)
        arrival = [c for c in ARRIVAL if c in kept]
        misread = sum(COUNTS[a] / total * probs[c] for a, c in zip(arrival, kept, strict=True))
    assert float((want - misread).abs().max()) > 1e-3  # the pairing is visible
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _probs(method: Any, tensors: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    model = method.run.model.build(method.run.num_classes)
    model.load_state_dict(tensors, strict=True)
    return torch.softmax(model.eval()(x).float(), dim=-1)
