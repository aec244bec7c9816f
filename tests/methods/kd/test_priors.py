"""Priors and divergences of the data-free distillation machinery (osfl.methods.kd.priors)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.kd.priors import (
    BNStatsLoss,
    adversarial_kl,
    disagreement_mask,
    js_divergence,
    kd_kl,
    l1_discrepancy,
    l2_prior,
    tv_loss,
)
from osfl.models import create_model


def _match_running_stats(model: nn.Module, x: torch.Tensor) -> None:
    """Set every BN layer's running stats to the (biased) statistics of its input on ``x``,
    layer after layer in eval mode, so that ``x`` *is* a batch equal to the running statistics."""
    model.eval()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        seen: dict[str, torch.Tensor] = {}

        def grab(m: nn.Module, i: tuple[torch.Tensor, ...], o: torch.Tensor, seen=seen) -> None:
            seen["x"] = i[0].detach()

        h = bn.register_forward_hook(grab)
        with torch.no_grad():
            model(x)
        h.remove()
        inp = seen["x"]
        bn.running_mean.copy_(inp.mean(dim=(0, 2, 3)))
        bn.running_var.copy_(inp.var(dim=(0, 2, 3), unbiased=False))


def test_bn_loss_is_zero_on_a_batch_equal_to_the_running_statistics() -> None:
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=10, in_chans=3)
    x = torch.randn(16, 3, 8, 8)
    _match_running_stats(model, x)
    with BNStatsLoss([model]) as bn:
        assert len(bn) == 3
        with bn.capture():
            model(x)
        assert float(bn.value().detach()) == pytest.approx(0.0, abs=1e-4)
        with bn.capture():
            model(x * 2 + 1)  # other statistics -> strictly positive
        assert float(bn.value().detach()) > 1.0


def test_bn_loss_formula_and_gradient_on_one_layer() -> None:
    bn_layer = nn.BatchNorm2d(2).eval()
    bn_layer.running_mean.copy_(torch.tensor([1.0, -1.0]))
    bn_layer.running_var.copy_(torch.tensor([2.0, 0.5]))
    x = torch.zeros(4, 2, 3, 3, requires_grad=True)
    loss = BNStatsLoss([bn_layer])
    with loss.capture():
        bn_layer(x)
    # mean 0, var 0: ||(0,0)-(1,-1)|| + ||(0,0)-(2,0.5)|| = sqrt(2) + sqrt(4.25)
    expected = math.sqrt(2) + math.sqrt(4.25)
    value = loss.value()
    assert float(value.detach()) == pytest.approx(expected, rel=1e-6)
    value.backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


def test_bn_loss_records_only_inside_capture_and_hooks_go_away() -> None:
    layer = nn.BatchNorm2d(1).eval()
    loss = BNStatsLoss([layer])
    layer(torch.randn(2, 1, 2, 2))  # outside capture: nothing recorded
    assert float(loss.value()) == 0.0
    loss.remove()
    with loss.capture():
        layer(torch.randn(2, 1, 2, 2))
    assert float(loss.value()) == 0.0  # hooks removed
    with pytest.raises(ConfigError):
        loss.value("max")


def test_bn_loss_is_zero_for_models_without_batchnorm() -> None:
    vit = create_model("vit_tiny_patch2_16", num_classes=10, img_size=8, depth=1)
    loss = BNStatsLoss([vit])
    with loss.capture():
        vit(torch.randn(2, 3, 8, 8))
    assert len(loss) == 0 and float(loss.value()) == 0.0


def test_tv_and_l2_priors_by_hand() -> None:
    const = torch.full((2, 3, 5, 5), 0.7)
    assert float(tv_loss(const, "l2")) == 0.0 and float(tv_loss(const, "l1")) == 0.0
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 0, 0] = 1.0
    # differences: horizontal (1, 0) -> norm 1; vertical (1, 0) -> 1; anti-diagonal 0 -> 0; diagonal 1 -> 1
    assert float(tv_loss(x, "l2")) == pytest.approx(3.0)
    assert float(tv_loss(x, "l1")) == pytest.approx(0.5 + 0.5 + 0.0 + 1.0)
    assert float(
        l2_prior(torch.tensor([[3.0, 4.0], [0.0, 0.0]]).view(2, 1, 1, 2))
    ) == pytest.approx(2.5)
    with pytest.raises(ConfigError):
        tv_loss(x, "l3")


def test_kd_kl_on_hand_made_logits() -> None:
    s = torch.tensor([[0.0, 0.0]])
    t = torch.tensor([[math.log(3.0), 0.0]])  # p_t = (0.75, 0.25), p_s = (0.5, 0.5)
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert float(kd_kl(s, t)) == pytest.approx(expected, rel=1e-6)
    # at T=2, p_t = softmax(log3/2, 0) = (sqrt3, 1)/(sqrt3+1); the loss carries T²
    a = math.sqrt(3) / (math.sqrt(3) + 1)
    kl2 = a * math.log(2 * a) + (1 - a) * math.log(2 * (1 - a))
    assert float(kd_kl(s, t, temperature=2.0)) == pytest.approx(4 * kl2, rel=1e-6)
    assert float(kd_kl(t, t)) == pytest.approx(0.0, abs=1e-7)
    assert kd_kl(torch.zeros(3, 4), torch.randn(3, 4), reduction="none").shape == (3,)
    with pytest.raises(ConfigError):
        kd_kl(s, t, temperature=0.0)


def test_js_divergence_properties() -> None:
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    assert float(js_divergence(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(js_divergence(a, b)) == pytest.approx(float(js_divergence(b, a)), rel=1e-5)
    big = 50.0
    far = js_divergence(torch.tensor([[big, 0.0]]), torch.tensor([[0.0, big]]))
    assert float(far) == pytest.approx(math.log(2), rel=1e-3)  # disjoint supports -> ln 2
    assert 0 <= float(js_divergence(a, b, clamp=0.01)) <= math.log(2)


def test_adversarial_kl_is_masked_by_disagreement() -> None:
    t = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # agrees on sample 0, disagrees on 1
    assert disagreement_mask(s, t).tolist() == [0.0, 1.0]
    per = kd_kl(s, t, reduction="none")
    assert float(adversarial_kl(s, t, masked=True)) == pytest.approx(-float(per[1]) / 2)
    assert float(adversarial_kl(s, t, masked=False)) == pytest.approx(-float(per.mean()))


def test_l1_discrepancy_weights_samples() -> None:
    s = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    t = torch.zeros(2, 2)
    assert float(l1_discrepancy(s, t)) == pytest.approx((2.0 + 0.0) / 2)
    assert float(l1_discrepancy(s, t, torch.tensor([0.5, 1.0]))) == pytest.approx(0.5)
