"""Gradient inversion (Inverting Gradients): its loss pieces, the update ->
gradient surrogate, label modes, and order-invariant scoring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.privacy.inversion import (
    InversionConfig,
    cosine_distance,
    invert_gradients,
    match_and_score,
    total_variation,
    update_to_gradient,
)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.sigmoid(self.fc1(x.flatten(1))))


def _grad(model, x, y):
    return [
        g.detach()
        for g in torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    ]


def test_total_variation_and_cosine_distance_values():
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 0, 1] = 1.0  # horizontal diffs |1|,|0| -> mean .5; vertical |0|,|1| -> mean .5
    assert float(total_variation(x)) == pytest.approx(1.0)
    a = [torch.tensor([1.0, 0.0]), torch.tensor([0.0])]
    assert float(cosine_distance(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(
        cosine_distance(a, [torch.tensor([-1.0, 0.0]), torch.tensor([0.0])])
    ) == pytest.approx(2.0)


def test_update_to_gradient_is_exact_for_one_sgd_step():
    torch.manual_seed(0)
    model = Tiny()
    x, y = torch.rand(4, 3, 4, 4), torch.tensor([0, 1, 2, 0])
    g = _grad(model, x, y)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p, gi in zip(model.parameters(), g, strict=True):
            p -= 0.1 * gi
    target = update_to_gradient(model, before, model.state_dict(), lr=0.1)
    for t, gi in zip(target, g, strict=True):
        torch.testing.assert_close(t, gi, atol=1e-5, rtol=1e-4)


def test_inversion_fits_the_gradient_with_given_and_joint_labels():
    torch.manual_seed(0)
    model = Tiny()
    x = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([2])
    target = _grad(model, x, y)
    cfg = InversionConfig(iterations=300, lr=0.05, tv=0.0, seed=0)
    res = invert_gradients(model, target, (1, 3, 4, 4), labels=y, config=cfg)
    assert res.images.shape == (1, 3, 4, 4) and res.images.min() >= 0 and res.images.max() <= 1
    assert res.losses[-1] < 0.5 * res.losses[0]  # the cosine gradient distance goes down
    joint = invert_gradients(model, target, (1, 3, 4, 4), num_classes=3, config=cfg)
    assert joint.labels.shape == (1,) and 0 <= int(joint.labels) < 3
    assert np.isfinite(joint.losses).all()


def test_inversion_refuses_mismatched_inputs():
    model = Tiny()
    with pytest.raises(ConfigError, match="tensors"):
        invert_gradients(model, [torch.zeros(1)], (1, 3, 4, 4), labels=[0])
    target = [torch.zeros_like(p) for p in model.parameters()]
    with pytest.raises(ConfigError, match="labels"):
        invert_gradients(model, target, (2, 3, 4, 4), labels=[0])
    with pytest.raises(ConfigError, match="num_classes"):
        invert_gradients(model, target, (1, 3, 4, 4))
    with pytest.raises(ConfigError):
        InversionConfig(iterations=0)


def test_match_and_score_is_order_invariant():
    g = torch.Generator().manual_seed(0)
    truth = torch.rand(4, 3, 8, 8, generator=g)
    recon = (truth + 0.05 * torch.randn(4, 3, 8, 8, generator=g)).clamp(0, 1)
    a = match_and_score(recon, truth)
    b = match_and_score(recon[torch.tensor([2, 0, 3, 1])], truth)
    assert a["psnr"] == pytest.approx(b["psnr"]) and a["ssim"] == pytest.approx(b["ssim"])
    assert b["assignment"] == [1, 3, 0, 2]
    assert a["psnr"] > 20


def _points(xy: list[list[float]]) -> torch.Tensor:
    """2-D points as 8×8 grey images (the first two pixels; distances kept)."""
    img = torch.zeros(len(xy), 1, 8, 8)
    img[:, 0, 0, :2] = torch.tensor(xy) / 4
    return img


def test_match_and_score_pairs_by_the_least_total_squared_error():
    """The assignment minimises the summed *squared* distance (the MSE): on
    these points it differs from the one of summed distances cubed."""
    recon = _points([[3.4, 0.1], [2.9, 0.7], [3.5, 2.2]])
    truth = _points([[1.2, 1.7], [0.1, 0.5], [2.7, 2.6]])
    assert match_and_score(recon, truth)["assignment"] == [1, 0, 2]
    with pytest.raises(ConfigError, match=r"^shapes differ: \(2, 1, 8, 8\) vs \(3, 1, 8, 8\)$"):
        match_and_score(recon[:2], truth)


def test_match_and_score_reports_the_mean_lpips_of_the_matched_pairs(monkeypatch):
    import osfl.privacy.inversion as inversion

    seen = []

    def fake_lpips(x, y):
        seen.append((x, y))
        return torch.tensor([0.2, 0.4, 0.9])

    monkeypatch.setattr(inversion, "lpips", fake_lpips)
    truth = _points([[1.2, 1.7], [0.1, 0.5], [2.7, 2.6]])
    out = match_and_score(truth[torch.tensor([2, 0, 1])], truth)
    assert out["lpips"] == pytest.approx(0.5)
    assert torch.equal(seen[0][0], truth) and torch.equal(seen[0][1], truth)  # matched back
    monkeypatch.setattr(inversion, "lpips", lambda x, y: None)
    assert "lpips" not in match_and_score(truth, truth)
