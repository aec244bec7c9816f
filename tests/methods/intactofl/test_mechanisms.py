"""Mechanism tests of IntactOFL (Zeng et al., "One-Shot-but-not-Degraded
Federated Learning", ACM MM 2024): the clients stay intact as experts and
the server trains only a gate that routes each input to them.

The experts here are made by hand so that the right routing is known: each
is correct on the classes it "holds" and confidently wrong on the others,
and an input's class is written in one pixel, so a linear gate can tell
whose class it is. The synthetic pool is that coded set (the generator is
tested with DENSE, whose synthesis IntactOFL reuses).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl import assembly
from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.fl.seeds import derive_seed
from osfl.methods import intactofl as intactofl_module
from osfl.methods.clients import model_from_state
from osfl.methods.intactofl import Gate, MoEPredictor, mix
from osfl.methods.kd.base import PhaseTimer, ServerSide, seeded
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher
from support.smoke import first_aggregation, smoke_config, smoke_context

CLASSES = 10
SHAPE = (1, 8, 8)


class CodedExpert(nn.Module):
    """Reads the class from the pixel it is written in: right on ``held``
    classes, and on any other class c it confidently answers c + 1."""

    def __init__(self, held: set[int]):
        super().__init__()
        w = torch.zeros(CLASSES, SHAPE[1] * SHAPE[2])
        for c in range(CLASSES):
            w[c if c in held else (c + 1) % CLASSES, c] = 5.0
        self.register_buffer("w", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.w.T


def coded(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images whose class c is a 1 at pixel c (plus a little noise)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % CLASSES
    x = 0.1 * torch.randn(n, *SHAPE, generator=g)
    x.view(n, -1)[torch.arange(n), y] += 1.0
    return x, y


HALVES = ({0, 1, 2, 3, 4}, {5, 6, 7, 8, 9})


@pytest.fixture(scope="module")
def run():
    return smoke_context(smoke_config("intactofl")).run


def train_gate(run, monkeypatch, **options):
    """The server loop of IntactOFL on the coded pool; returns (MoE, initial gate)."""
    pool_x, pool_y = coded(40, seed=1)
    monkeypatch.setattr(
        intactofl_module,
        "synthesize_batch",
        lambda side, cfg, batch_size, gen, loss_fn: (pool_x, pool_y, {}),
    )
    cls = METHODS.get("intactofl")
    opts = {
        "gate": "linear",
        "epochs": 6,
        "augment": "none",
        "bn_weight": 0.0,
        "generator": {"nz": 8, "ngf": 8},
        "distill": {"lr": 0.5, "schedule": "constant", "batch_size": 20},
        **options,
    }
    method = cls(method_config(cls, opts), run)
    side = ServerSide(
        run=run,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        space=InputSpace.identity(1),
        client_ids=[0, 1],
        num_samples=[20, 20],
        timer=PhaseTimer(),
    )
    experts = [CodedExpert(h) for h in HALVES]
    gate = method.build_student({}, side)
    initial = copy.deepcopy(gate)
    moe = method.server_train(side, EnsembleTeacher(experts), gate)
    return moe, MoEPredictor(experts, initial, CLASSES).eval()


def routing(moe: MoEPredictor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean gate weight on the expert that holds each input's class, and accuracy."""
    with torch.no_grad():
        out, g = moe.mixture(x)
    owner = (y >= 5).long()
    return float(g[torch.arange(len(y)), owner].mean()), float((out.argmax(1) == y).float().mean())


def test_the_trained_gate_routes_each_class_to_the_expert_that_holds_it(run, monkeypatch):
    """IntactOFL's gate training (paper Eq. 2: CE of the gated mixture on the
    synthetic pool, the experts frozen): the trained gate's routing differs
    from its initialisation and puts most of each input's weight on the
    expert that is right on its class, so the mixture beats the initial one."""
    moe, initial = train_gate(run, monkeypatch)
    x, y = coded(60, seed=2)
    share0, acc0 = routing(initial, x, y)
    share, acc = routing(moe, x, y)
    assert abs(share0 - 0.5) < 0.2  # the initial gate has no preference
    assert share > 0.8 and acc > acc0 + 0.3 and acc >= 0.9
    with torch.no_grad():
        assert float((moe.gate(x) - initial.gate(x)).abs().max()) > 0.3
    # the experts are intact: exactly the clients' models after the server ran
    for expert, held in zip(moe.experts, HALVES, strict=True):
        torch.testing.assert_close(expert.w, CodedExpert(held).w)


def test_a_top_1_gate_learns_to_route_too(run, monkeypatch):
    """With ``top_k: 1`` each input goes to one expert, and a softmax over one
    kept score is the constant 1: without a gradient path the gate would stay
    at its random initialisation. Its training signal is the dense softmax's
    (straight-through): the top-1 gate routes as well as the dense one, and
    each input still runs exactly one expert, unweighted."""
    moe, initial = train_gate(run, monkeypatch, top_k=1)
    x, y = coded(60, seed=2)
    share0, _ = routing(initial, x, y)
    share, acc = routing(moe, x, y)
    assert share > 0.9 and share > share0 + 0.3 and acc >= 0.9
    with torch.no_grad():
        g = moe.gate(x)
    assert torch.equal(g, F.one_hot(g.argmax(1), 2).float())


def test_the_balance_term_alone_evens_out_the_gate(run, monkeypatch):
    """The routing comes from the mixture's CE (paper Eq. 2), not from the
    balance term: with ``ce_weight=0`` the gate learns no routing, and the
    balance term ``std(G(x))`` it then minimises alone spreads its weights
    more evenly than at initialisation."""
    moe, initial = train_gate(
        run, monkeypatch, balance_weight=1.0, distill={"ce_weight": 0.0, "lr": 0.5}
    )
    x, y = coded(60, seed=2)
    share, _ = routing(moe, x, y)
    assert share < 0.7
    with torch.no_grad():
        assert float(moe.gate(x).std()) < 0.7 * float(initial.gate(x).std())


def test_the_server_keeps_the_trained_gate_and_the_intact_clients() -> None:
    """IntactOFL's server state (Alg. 1): the gate it returns is the one the
    server trained (not its seeded initialisation), and the experts are the
    clients' uploads, unchanged; the predictor mixes exactly those."""
    cfg = smoke_config("intactofl")
    ctx = smoke_context(cfg)
    state, uploads = first_aggregation(assembly.build_job(cfg, "intactofl", ctx))
    cls = METHODS.get("intactofl")

    class Spy(cls):  # type: ignore[misc,valid-type]
        def server_train(self, side, teacher, student):
            self.trained = super().server_train(side, teacher, student)
            return self.trained

    method = Spy(method_config(cls, {"epochs": 2, "synthesis_batch_size": 32}), ctx.run)
    new = method.aggregate(state, uploads, 0)
    with seeded(derive_seed(ctx.run.seed, "kd-server", "gate")):
        initial = method.build_gate(len(uploads))
    trained = method.trained.gate.state_dict()
    assert set(new["server"]) == set(trained)
    assert all(torch.equal(new["server"][k], v) for k, v in trained.items())
    assert any(not torch.equal(trained[k], v) for k, v in initial.state_dict().items())
    for c, up in uploads.items():
        for k, v in up.tensors.items():
            assert torch.equal(new["clients"][c][k], v)
    moe = method.predictor(new)
    x = ctx.run.eval_transform(ctx.splits.test.images[:16])
    with torch.no_grad():
        out, g = moe.mixture(x)
        assert float((g - initial(x)).abs().max()) > 1e-3
        experts = [model_from_state(ctx.run, uploads[c].tensors).eval() for c in sorted(uploads)]
        torch.testing.assert_close(out, mix(torch.stack([e(x) for e in experts]), g))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_top_k_gate_keeps_the_highest_scoring_experts(top_k: int) -> None:
    """The sparse gate (Shazeer et al., 2017, as IntactOFL's ``topk``): each
    input's weights are a softmax over its ``top_k`` *highest* gate scores,
    zero elsewhere."""
    torch.manual_seed(0)
    gate = Gate("mlp", SHAPE, experts=4, top_k=top_k, hidden=16)
    x = torch.randn(32, *SHAPE)
    with torch.no_grad():
        scores = gate.net(x.flatten(1))
        g = gate(x)
    top = scores.topk(top_k, dim=1)
    expected = torch.zeros_like(g).scatter(1, top.indices, torch.softmax(top.values, dim=1))
    torch.testing.assert_close(g, expected)
