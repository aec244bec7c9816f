"""IntactOFL roles and directions: the generator's loss terms by hand, and
the released MoE keeps each gate output paired with its client.

The generator's loss (module docstring) has four terms with different roles:
the MoE (gate-mixed experts) is the teacher of the adversarial KL and the
plain ensemble E its student, KL(MoE_T ‖ E_T) masked where their argmaxes
differ and negated; the BN term averages the clients' BN losses over the M
clients; the diversity term is the *negated* variance of the experts'
softmax outputs. The loss closure is captured from ``server_train`` (its
``synthesize_batch`` replaced by a spy) and evaluated on one fixed batch,
with experts whose outputs and BN statistics differ, so exchanging any two
roles, dropping the 1/M or flipping a sign changes a term.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.methods import intactofl as intactofl_module
from osfl.methods.clients import initial_state
from osfl.methods.kd.base import PhaseTimer, ServerSide
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher
from support.smoke import smoke_config, smoke_context

CLASSES = 3


class BNExpert(nn.Module):
    """BatchNorm2d with set running statistics, then a fixed linear map."""

    def __init__(self, mean: float, var: float, w: torch.Tensor, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.bn.running_mean.fill_(mean)
        self.bn.running_var.fill_(var)
        self.register_buffer("w", w)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x).flatten(1) @ self.w.T


@pytest.fixture(scope="module")
def run() -> Any:
    return smoke_context(smoke_config("intactofl")).run


def test_generator_loss_terms_by_hand(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    shape = run.image_shape
    c, d = shape[0], shape[0] * shape[1] * shape[2]
    w0 = torch.randn(CLASSES, d, generator=g)
    # expert 1 mostly opposes expert 0: the MoE follows whichever the gate favours,
    # the plain mean follows expert 1, so their argmaxes differ on some images
    w1 = -2.0 * w0 + 0.1 * torch.randn(CLASSES, d, generator=g)
    experts = [BNExpert(0.5, 2.0, w0, c), BNExpert(-1.0, 0.5, w1, c)]
    x = torch.randn(6, *shape, generator=g)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    seen: dict[str, Any] = {}

    def spy(side: Any, cfg: Any, batch_size: int, gen: Any, loss_fn: Any) -> Any:
        if "terms" not in seen:
            seen["terms"] = loss_fn(x, y)[1]
        return x, y, {}

    monkeypatch.setattr(intactofl_module, "synthesize_batch", spy)
    cls = METHODS.get("intactofl")
    opts = {
        "gate": "linear",
        "epochs": 1,
        "augment": "none",
        "bn_weight": 2.0,
        "oh_weight": 1.0,
        "adv_weight": 1.0,
        "adv_temperature": 3.0,
        "diversity_weight": 0.5,
        "generator": {"nz": 8, "ngf": 8},
        "distill": {"batch_size": 6},
    }
    method = cls(method_config(cls, opts), run)
    side = ServerSide(
        run=run,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        space=InputSpace.identity(c),
        client_ids=[0, 1],
        num_samples=[20, 20],
        timer=PhaseTimer(),
    )
    gate = method.build_student({}, side)
    with torch.no_grad():  # a gate that favours expert 1 on some images, expert 0 on others
        gate.net.weight.copy_(3.0 * torch.randn(gate.net.weight.shape, generator=g))
        gate.net.bias.zero_()
        weights = gate(x)
    method.server_train(side, EnsembleTeacher(experts), gate)
    terms = seen["terms"]

    with torch.no_grad():
        logits = torch.stack([e(x) for e in experts])  # (M, B, K)
        moe = (weights.T[:, :, None] * logits).sum(0)
        plain = logits.mean(0)
        bn = 0.0
        for e in experts:
            mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
            bn += float((mean - e.bn.running_mean).norm() + (var - e.bn.running_var).norm())
        t = 3.0
        p_moe, log_plain = F.softmax(moe / t, 1), F.log_softmax(plain / t, 1)
        kl = (p_moe * (p_moe.log() - log_plain)).sum(1) * t**2  # KL(MoE_T || E_T)
        mask = (moe.argmax(1) != plain.argmax(1)).float()
        var_k = F.softmax(logits, -1).var(0, unbiased=False).sum(-1).mean()
    assert 0 < float(mask.sum()) < len(y)  # the mask selects some samples, not all
    assert terms["oh"] == pytest.approx(float(F.cross_entropy(moe, y)), rel=1e-5)
    assert terms["bn"] == pytest.approx(2.0 * bn / 2, rel=1e-5)
    assert terms["adv"] == pytest.approx(-float((mask * kl).mean()), rel=1e-5)
    assert terms["div"] == pytest.approx(-0.5 * float(var_k), rel=1e-5)


def test_the_released_moe_pairs_gate_output_k_with_client_k(run: Any) -> None:
    """A gate fixed on expert 0 (bias +50 / -50, zero weights): the released
    MoE is client 0's model, whose weights differ from client 1's."""
    cls = METHODS.get("intactofl")
    method = cls(method_config(cls, {"gate": "linear"}), run)
    gate = method.build_gate(2)
    with torch.no_grad():
        gate.net.weight.zero_()
        gate.net.bias.copy_(torch.tensor([50.0, -50.0]))
    zero = initial_state(run)
    other = {k: (v + 0.5 if v.is_floating_point() else v) for k, v in zero.items()}
    state = {"clients": {0: zero, 1: other}, "server": gate.state_dict()}
    moe = method.predictor(state)
    x = torch.rand(4, *run.image_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = moe(x)
        first, second = moe.experts[0](x).float(), moe.experts[1](x).float()
    assert float((first - second).abs().max()) > 1e-3
    torch.testing.assert_close(got, first, rtol=0, atol=1e-5)
    assert torch.equal(next(iter(moe.experts[0].state_dict().values())), next(iter(zero.values())))
