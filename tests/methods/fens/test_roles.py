"""FENS roles: the aggregator's input slot k is client k's model, in client
order, on the server as on the clients.

The aggregator is trained on the K members' logits stacked in client order
(the clients' ``heldout_logits``; the authors' ``torch.hstack`` over the
clients); its first layer reads them slot by slot, so the released
predictor must put the members in the same order. Each member here has
distinguishable weights, and the expected output is computed from the state
with the ids sorted by hand, so any other pairing fails; the order in which
the state happens to hold the members (a dict) must not matter. From round 1
each client's aggregator update is weighted by its own sample count, after
the server has dropped the refused and the unusable ones, whatever order
the uploads arrived in.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl import assembly
from osfl.config import load_config
from osfl.fl.method import METHODS
from osfl.fl.upload import Upload
from osfl.methods.clients import initial_state
from osfl.methods.fens import method as fens_module
from osfl.methods.fens.quantize import quantize_int8
from support.smoke import BASE, smoke_context


@pytest.fixture(scope="module")
def method() -> Any:
    cfg = load_config(None, [*BASE, *METHODS.get("fens").card.smoke, "methods=[fens]"])
    return assembly.build_job(cfg, "fens", smoke_context(cfg)).method


def test_the_predictor_reads_the_members_in_client_order(method: Any) -> None:
    base = initial_state(method.run)
    members = {}
    for c, shift in ((2, -0.3), (0, 0.2), (1, 0.6)):  # held in a scrambled order
        sd = {k: v + shift * (1 + c) if v.is_floating_point() else v for k, v in base.items()}
        members[c] = quantize_int8(sd, method.int8_keys)
    aggregator = method.new_aggregator(3)
    with torch.no_grad():
        for p in aggregator.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    state = {"members": members, "aggregator": aggregator.state_dict()}
    x = torch.rand(5, *method.run.image_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [method.member_model(members[c]).eval()(x).float() for c in (0, 1, 2)]
        want = aggregator(torch.stack(logits, dim=1))
        got = method.predictor(state).eval()(x)
        reordered = {c: members[c] for c in (1, 2, 0)}
        again = method.predictor({**state, "members": reordered}).eval()(x)
        swapped = aggregator(torch.stack(logits[::-1], dim=1))
    assert float((want - swapped).abs().max()) > 1e-3  # the slots are distinguishable
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("refused", [0, 2, 4])
def test_each_aggregator_upload_is_weighted_by_its_own_client_s_samples(
    method: Any, monkeypatch: pytest.MonkeyPatch, refused: int
) -> None:
    """From round 1 the server combines the clients' aggregator updates
    weighted by the samples each one's steps saw (``n_k / Σ n``, the authors'
    FedAdam over FedAvg weights). The uploads arrive scrambled, one client
    is refused on the way in (first, middle or last) and one carries an
    unusable count: every remaining update must go in with its own client's
    weight, by client id, whatever the arrival order."""
    counts = {0: 7, 1: 30, 2: 11, 3: 52, 4: 19}
    arrival = (3, 0, 4, 2, 1)
    unusable = 1 if refused != 1 else 3
    agg = {k: v.clone() for k, v in method.new_aggregator(5).state_dict().items()}
    uploads = {
        c: Upload(
            tensors={k: v + float(c + 1) for k, v in agg.items()},
            meta={"num_samples": 0 if c == unusable else counts[c]},
        )
        for c in arrival
        if c != refused
    }
    seen: list[tuple[list[dict[str, torch.Tensor]], list[float]]] = []
    real = fens_module.combine_states

    def spy(run, states, weights, reference, **kwargs):
        seen.append((list(states), list(weights)))
        return real(run, states, weights, reference, **kwargs)

    monkeypatch.setattr(fens_module, "combine_states", spy)
    state = {**method.init_state(), "aggregator": agg}
    method.aggregate(state, uploads, 1)
    ((states, weights),) = seen
    kept = sorted(c for c in counts if c not in (refused, unusable))
    total = sum(counts[c] for c in kept)
    assert len(states) == len(weights) == len(kept)
    for s, w in zip(states, weights, strict=True):
        (c,) = [c for c in kept if s is uploads[c].tensors]  # which client this update is
        assert w == pytest.approx(counts[c] / total)
