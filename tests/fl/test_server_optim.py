"""Server optimisers (osfl.fl.server_optim): FedAvg's and FedAdam's step from
the round's combined state, by hand and against torch's Adam."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.server_optim import ServerOptConfig, server_step


def test_fedadam_one_round_by_hand_and_as_torch_adam():
    """Round 1 of the authors' FedAdam (m = v = 0 before, no bias correction):
    x + η (1−β₁)Δ / (√((1−β₂)Δ²) + τ); equal to one torch Adam step on −Δ
    with lr η(1−β₁)/√(1−β₂) and eps τ/√(1−β₂). Integer buffers take the
    combined value."""
    cfg = ServerOptConfig(optimizer="fedadam", lr=1e-3, beta1=0.9, beta2=0.99, tau=1e-3)
    x = {"w": torch.tensor([0.5, -1.0, 2.0]), "n": torch.tensor(3)}
    combined = {"w": torch.tensor([0.6, -1.0, 1.5]), "n": torch.tensor(5)}
    new, slots = server_step(cfg, x, combined)
    # Δ = (0.1, 0, -0.5): m = (0.01, 0, -0.05), √v = (0.01, 0, 0.05)
    hand = [0.5 + 1e-3 * 0.01 / 0.011, -1.0, 2.0 - 1e-3 * 0.05 / 0.051]
    assert torch.allclose(new["w"], torch.tensor(hand)) and int(new["n"]) == 5
    assert torch.allclose(slots["m"]["w"].float(), torch.tensor([0.01, 0.0, -0.05]))
    p = nn.Parameter(x["w"].clone())
    s = (1 - cfg.beta2) ** 0.5
    adam = torch.optim.Adam(
        [p], lr=cfg.lr * (1 - cfg.beta1) / s, betas=(0.9, 0.99), eps=cfg.tau / s
    )
    p.grad = -(combined["w"] - x["w"])
    adam.step()
    assert torch.allclose(new["w"], p.detach(), atol=1e-7)


def test_fedavg_with_lr_one_is_the_combined_state():
    x = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(1)}
    combined = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(2)}
    new, slots = server_step(ServerOptConfig(), x, combined)
    assert torch.equal(new["w"], combined["w"]) and int(new["n"]) == 2 and slots == {}
    half, _ = server_step(ServerOptConfig(lr=0.5), x, combined)
    assert torch.allclose(half["w"], torch.tensor([0.5, 3.0]))


def test_fedadam_keeps_its_moments_between_rounds():
    """Round 2 by hand: m and v decay and take the new Δ (no bias correction)."""
    cfg = ServerOptConfig(optimizer="fedadam", lr=0.1, beta1=0.5, beta2=0.75, tau=0.5)
    x = {"w": torch.tensor([0.0], dtype=torch.float64)}
    x, slots = server_step(cfg, x, {"w": x["w"] + 2.0})  # m = 1, v = 1: x = 0.1 / 1.5
    assert torch.allclose(x["w"], torch.tensor([0.1 / 1.5], dtype=torch.float64))
    x, slots = server_step(cfg, x, {"w": x["w"] - 2.0}, slots)  # m = 0.5 - 1, v = 0.75 + 1
    step = 0.1 * (0.5 - 1.0) / (1.75**0.5 + 0.5)
    assert torch.allclose(x["w"], torch.tensor([0.1 / 1.5 + step], dtype=torch.float64))


@pytest.mark.parametrize(
    ("bad", "words"),
    [({"optimizer": "yogi"}, "server optimiser"), ({"lr": 0.0}, "lr"), ({"tau": 0.0}, "tau")],
)
def test_bad_server_options_are_refused(bad, words):
    with pytest.raises(ConfigError, match=words):
        ServerOptConfig(**bad)
