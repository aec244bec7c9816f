"""cAcc / iAcc exactly as RLU's Appendix B.4 (Eqs. 91-92), and the image metrics."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from osfl.errors import DataError
from osfl.privacy.label_recovery import LabelRecoveryResult
from osfl.privacy.metrics import (
    class_accuracy,
    instance_accuracy,
    label_metrics,
    lpips,
    lpips_weights_available,
    psnr,
    ssim,
)


def test_cacc_iacc_worked_example():
    # truth: labels {0,0,1,3,3,3} over N=5 classes; recovered {0,1,1,2,3,3}
    truth = [0, 0, 1, 3, 3, 3]
    pred = np.array([1, 2, 1, 2, 0])  # counts of 0..4
    # presence: truth 1,1,0,1,0 ; pred 1,1,1,1,0 -> agree on classes 0,1,3,4 -> 4/5
    # multiset intersection: min(2,1)+min(1,2)+0+min(3,2)+0 = 1+1+2 = 4 of 6
    m = label_metrics(pred, truth, num_classes=5)
    assert m == {"cAcc": pytest.approx(4 / 5), "iAcc": pytest.approx(4 / 6)}
    r = LabelRecoveryResult("x", pred)
    assert r.score(torch.tensor(truth)) == m
    assert r.labels().tolist() == [0, 1, 1, 2, 3, 3]


def test_perfect_and_worst_cases():
    t = np.array([3, 0, 2])
    assert class_accuracy(t, t) == 1.0 and instance_accuracy(t, t) == 1.0
    assert class_accuracy(np.array([0, 5, 0]), t) == 0.0  # every class presence wrong
    assert instance_accuracy(np.array([0, 5, 0]), t) == 0.0
    assert label_metrics([3, 0, 2], [3, 0, 2], num_classes=3, truth_is_counts=True)["iAcc"] == 1.0


def test_bad_inputs_refused():
    with pytest.raises(DataError, match="shape"):
        label_metrics([1, 2], [0, 1], num_classes=3)
    with pytest.raises(DataError, match=r"\[0, 3\)"):
        label_metrics([1, 1, 0], [0, 5], num_classes=3)
    with pytest.raises(DataError, match="no labels"):
        instance_accuracy(np.array([1, 0]), np.array([0, 0]))
    with pytest.raises(ValueError):
        LabelRecoveryResult("x", np.array([1, -1]))


def test_psnr_known_value_and_ssim_identity():
    x = torch.full((2, 3, 16, 16), 0.5)
    y = x + 0.1  # MSE 0.01 -> PSNR = 10 log10(1 / 0.01) = 20 dB
    np.testing.assert_allclose(psnr(y, x).numpy(), [20.0, 20.0], atol=1e-4)
    img = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(ssim(img, img).numpy(), [1.0, 1.0], atol=1e-5)
    assert (ssim(img, torch.rand(2, 3, 16, 16)) < 0.5).all()
    with pytest.raises(DataError):
        psnr(x, x[:1])


def test_lpips_is_skipped_without_local_weights(caplog):
    x = torch.rand(1, 3, 16, 16)
    why = lpips_weights_available()
    if why is None:
        pytest.skip("LPIPS weights are present on this machine")
    with caplog.at_level(logging.INFO, logger="osfl.privacy.metrics"):
        assert lpips(x, x) is None
    assert [r.getMessage() for r in caplog.records] == [why]  # says why it is skipped


def test_lpips_scores_each_image_pair_in_0_1_float_with_the_named_backbone(monkeypatch):
    """LPIPS itself cannot run here (torchvision and its backbone weights are
    absent); what osfl adds around torchmetrics' function can: images clamped
    to [0, 1] in float32 and passed with ``normalize=True`` (torchmetrics then
    maps them to [-1, 1]), one call per image pair, the backbone named."""
    import torchmetrics.functional.image.lpips as tm_lpips

    from osfl.privacy import metrics

    calls: list[tuple[torch.Tensor, torch.Tensor, dict]] = []

    def fake(a: torch.Tensor, b: torch.Tensor, **kw) -> torch.Tensor:
        calls.append((a, b, kw))
        return (a - b).abs().mean()

    asked: list[str] = []
    monkeypatch.setattr(metrics, "lpips_weights_available", lambda net: asked.append(net))
    monkeypatch.setattr(tm_lpips, "learned_perceptual_image_patch_similarity", fake)
    x = torch.tensor([[[[2.0, -1.0]]]]).expand(2, 3, 1, 2).clone()
    x[1] = 0.25
    y = torch.tensor([[[[-0.5, 2.5]]]], dtype=torch.float64).expand(2, 3, 1, 2)
    out = lpips(x, y, net="vgg")  # x: [2, -1] and y: [-0.5, 2.5] clamp to [1, 0] and [0, 1]
    assert asked == ["vgg"]  # the weights looked for are the named backbone's
    assert out is not None and out.shape == (2,)
    assert torch.allclose(out, torch.tensor([1.0, 0.5]))
    assert len(calls) == 2
    for a, b, kw in calls:
        assert a.shape == (1, 3, 1, 2) and a.dtype == b.dtype == torch.float32
        assert float(a.max()) <= 1.0 and float(a.min()) >= 0.0
        assert kw == {"net_type": "vgg", "normalize": True}
    calls.clear()
    lpips(x, y)
    assert calls[0][2]["net_type"] == "alex"  # the default backbone
