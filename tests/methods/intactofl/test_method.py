"""IntactOFL (Zeng et al., ACM MM 2024): the gate is a distribution over the
experts, the predictor is exactly the gated mixture of the intact client
models, its inference FLOPs grow with the number of clients, bad options are
refused, and a tiny end-to-end run beats chance."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.config import method_config
from osfl.errors import ConfigError
from osfl.fl.evaluate import evaluate
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from osfl.methods.intactofl import Gate, IntactOFLConfig, MoEPredictor

SHAPE = (1, 8, 8)
FAST = {
    "epochs": 2,
    "synthesis_batch_size": 16,
    "generator": {"steps": 2, "ngf": 8},
    "distill": {"batch_size": 16},
}


def experts(m: int, k: int = 10) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Flatten(), nn.Linear(64, k)) for _ in range(m)]


@pytest.mark.parametrize("arch", ["linear", "mlp"])
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_gate_is_a_top_k_distribution(arch: str, top_k: int) -> None:
    torch.manual_seed(0)
    g = Gate(arch, SHAPE, experts=4, top_k=top_k, hidden=16)(torch.randn(32, *SHAPE))
    assert g.shape == (32, 4)
    assert bool((g >= 0).all())
    assert torch.allclose(g.sum(1), torch.ones(32), atol=1e-6)
    assert int((g > 0).sum(1).max()) <= top_k
    if top_k == 4:
        assert bool((g > 0).all())  # dense routing: every expert has a share


@pytest.mark.parametrize("top_k", [2, 4])
def test_predictor_is_the_gated_mixture_of_the_experts(top_k: int) -> None:
    members = experts(4)
    torch.manual_seed(1)
    moe = MoEPredictor(members, Gate("mlp", SHAPE, 4, top_k, hidden=16), num_classes=10).eval()
    x = torch.randn(24, *SHAPE)
    with torch.no_grad():
        out, g = moe.mixture(x)
        expected = sum(g[:, k : k + 1] * m(x) for k, m in enumerate(members))
        assert out.shape == (24, 10)
        assert torch.allclose(moe(x), out)
    assert torch.allclose(out, expected, atol=1e-5)
    assert all(not p.requires_grad for p in moe.experts.parameters())
    assert all(p.requires_grad for p in moe.gate.parameters())


def test_experts_stay_in_eval_mode_while_the_gate_trains() -> None:
    members = [nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(3))]
    members[0](torch.randn(2, *SHAPE))  # materialise the lazy layer
    moe = MoEPredictor(members, Gate("linear", SHAPE, 1, 1), num_classes=3).train()
    assert moe.gate.training and not moe.experts[0][1].training


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "top_k"),
        ({"gate": "transformer"}, "linear"),
        ({"gate_hidden": 0}, "gate_hidden"),
        ({"balance_weight": -1.0}, "balance_weight"),
        ({"epochs": 0}, "epochs"),
        ({"adv_temperature": 0.0}, "adv_temperature"),
        ({"ods_eps": -0.1}, "ods_eps"),
    ],
)
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        method_config(METHODS.get("intactofl"), options)


def test_top_k_above_the_number_of_clients_is_refused(make_ctx) -> None:
    ctx = make_ctx(3)
    cls = METHODS.get("intactofl")
    with pytest.raises(ConfigError, match="top_k=5 exceeds the run's 3 clients"):
        cls(IntactOFLConfig(top_k=5), ctx.run).check()
    with pytest.raises(ConfigError, match="top_k"):
        Gate("mlp", SHAPE, experts=3, top_k=4)


def run(ctx, **options: object):
    cls = METHODS.get("intactofl")
    method = cls(method_config(cls, options), ctx.run)
    method.check()
    return method, run_simulation(method, ctx.run, ctx.splits.train, ctx.federation)


def test_inference_flops_grow_with_the_number_of_clients(make_ctx) -> None:
    records = {}
    for m in (3, 5):
        method, res = run(make_ctx(m), **FAST)
        records[m] = method.report(res.state)["inference"]
        assert records[m]["experts"] == m and records[m]["top_k"] == m
        # every expert runs on every image, plus the gate
        assert records[m]["ratio_to_single_client"] >= m
    assert records[5]["gflops_per_image"] > records[3]["gflops_per_image"]
    single = {m: r["single_client_gflops_per_image"] for m, r in records.items()}
    assert single[3] == pytest.approx(single[5])


def test_top_k_routing_runs_fewer_experts(make_ctx) -> None:
    method, res = run(make_ctx(5), **FAST, top_k=1)
    inference = method.report(res.state)["inference"]
    assert inference["top_k"] == 1
    assert inference["ratio_to_single_client"] < 2  # one expert per image + the gate


def test_end_to_end_beats_chance(make_ctx) -> None:
    ctx = make_ctx(3)
    method, res = run(
        ctx,
        epochs=4,
        synthesis_batch_size=32,
        generator={"steps": 5},
        distill={"batch_size": 32},
    )
    acc = evaluate(res.predictor, ctx.splits.test, ctx.run.eval_transform, "cpu").accuracy
    assert acc > 0.3  # chance is 0.1 on the ten digit classes
    assert isinstance(res.predictor, MoEPredictor)
    report = method.report(res.state)
    assert set(report["phases"]["seconds"]) == {"synthesis", "distillation"}
    # the server state holds the gate only; the experts are the clients' uploads
    assert all(not k.startswith("experts.") for k in res.state["server"])
    assert sorted(method.release(res.state)) == ["clients", "server"]
