"""FENS roles: the aggregator's input slot k is client k's model, in client
order, on the server as on the clients.

The aggregator is trained on the K members' logits stacked in client order
(the clients' ``heldout_logits``; the authors' ``torch.hstack`` over the
clients); its first layer reads them slot by slot, so the released
predictor must put the members in the same order. Each member here has
distinguishable weights, and the expected output is computed from the state
with the ids sorted by hand, so any other pairing fails; the order in which
the state happens to hold the members (a dict) must not matter.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl import assembly
from osfl.config import load_config
from osfl.fl.method import METHODS
from osfl.methods.clients import initial_state
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
