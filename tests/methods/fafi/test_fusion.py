"""FAFI's IFFI (Eq. 8-10) on a tiny constructed case worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.fafi.fusion import (
    IFFIPredictor,
    NoiseSpec,
    draw_noise,
    fuse,
    global_prototypes,
    iffi_weights,
    median_prototypes,
)


def _linear(weight: list[list[float]]) -> nn.Module:
    """An extractor: a 1×1×2 image -> W @ x (2-d feature)."""
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(weight))
    return nn.Sequential(nn.Flatten(), lin)


def _case() -> tuple[IFFIPredictor, torch.Tensor]:
    # Client A: identity. Client B: W = [[10, 5], [0, 0.5]] -- for the test sample
    # x = (0.2, 1) its feature (7, 0.5) is nearly parallel to its noise feature (10, 0),
    # so IFFI should nearly ignore it, while the plain average follows its large norm.
    a = _linear([[1.0, 0.0], [0.0, 1.0]])
    b = _linear([[10.0, 5.0], [0.0, 0.5]])
    noise = torch.tensor([[[[1.0, 0.0]]]])  # one "noise" image, fixed for the hand computation
    protos = global_prototypes([torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.zeros(2, 2)])
    pred = IFFIPredictor([a, b], protos, fusion="iffi", noise=noise)
    return pred, torch.tensor([[[[0.2, 1.0]]]])


def test_global_prototypes_are_the_mean() -> None:
    p = global_prototypes([torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.zeros(2, 2)])
    assert torch.equal(p, torch.tensor([[1.0, 0.0], [0.0, 0.5]]))
    with pytest.raises(ValueError):
        global_prototypes([])


def test_iffi_weights_and_prediction_by_hand() -> None:
    pred, x = _case()
    scores = pred(x)
    alpha_a = 1 - 0.2 / math.sqrt(1.04)  # cos((0.2, 1), (1, 0))
    alpha_b = 1 - 7 / math.sqrt(49.25)  # cos((7, 0.5), (10, 0))
    assert pred.last_weights is not None
    assert pred.last_weights[:, 0].tolist() == pytest.approx([alpha_a, alpha_b], abs=1e-6)
    fused = (alpha_a * torch.tensor([0.2, 1.0]) + alpha_b * torch.tensor([7.0, 0.5])) / (
        alpha_a + alpha_b
    )
    assert torch.allclose(pred.fused_features(x)[0], fused, atol=1e-6)
    # cosines to the global prototypes (1, 0) and (0, 0.5)
    n = fused.norm().item()
    assert scores[0].tolist() == pytest.approx([fused[0].item() / n, fused[1].item() / n], abs=1e-6)
    assert scores.argmax(1).item() == 1


def test_plain_average_is_fooled_where_iffi_is_not() -> None:
    pred, x = _case()
    avg = IFFIPredictor(list(pred.extractors), pred.prototypes, fusion="average")
    # mean of (0.2, 1) and (7, 0.5) = (3.6, 0.75): nearest prototype is class 0
    assert torch.allclose(avg.fused_features(x)[0], torch.tensor([3.6, 0.75]))
    assert avg(x).argmax(1).item() == 0
    assert pred(x).argmax(1).item() == 1


def test_iffi_weights_shapes_and_range() -> None:
    feats = torch.randn(3, 5, 4)
    w = iffi_weights(feats, torch.randn(3, 4))
    assert w.shape == (3, 5)
    assert bool((w >= 0).all() and (w <= 2).all())
    # a feature equal to the noise feature gets weight 0, its opposite weight 2
    noise = torch.tensor([[1.0, 2.0]])
    assert iffi_weights(torch.tensor([[[2.0, 4.0], [-1.0, -2.0]]]), noise)[0].tolist() == (
        pytest.approx([0.0, 2.0], abs=1e-6)
    )


def test_fuse_falls_back_to_mean_when_all_weights_vanish() -> None:
    feats = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 3.0]]])  # M=2, B=2
    w = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    out = fuse(feats, w)
    assert out[0].tolist() == pytest.approx([0.5, 0.5])  # all-zero weights -> plain mean
    assert out[1].tolist() == pytest.approx([0.25, 2.25])  # (1*(1,0) + 3*(0,3)) / 4
    assert torch.allclose(fuse(feats), torch.tensor([[0.5, 0.5], [0.5, 1.5]]))


def test_prediction_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    extractors = [nn.Sequential(nn.Flatten(), nn.Linear(12, 4)) for _ in range(3)]
    noise = draw_noise((3, 2, 2), samples=2, seed=7)
    pred = IFFIPredictor(extractors, torch.randn(5, 4), noise=noise).eval()
    x = torch.randn(6, 3, 2, 2)
    full = pred(x)
    parts = torch.cat([pred(x[:2]), pred(x[2:])])
    assert torch.allclose(full, parts, atol=1e-6)
    assert full.shape == (6, 5) and bool(torch.isfinite(full).all())


def test_normalize_features_option() -> None:
    pred, x = _case()
    norm = IFFIPredictor(
        list(pred.extractors), pred.prototypes, fusion="average", normalize_features=True
    )
    unit_a = torch.tensor([0.2, 1.0]) / math.sqrt(1.04)
    unit_b = torch.tensor([7.0, 0.5]) / math.sqrt(49.25)
    assert torch.allclose(norm.fused_features(x)[0], (unit_a + unit_b) / 2, atol=1e-6)


def test_noise_is_seeded_and_parametrised() -> None:
    a = draw_noise((1, 4, 4), samples=3, mean=1.0, std=0.0, seed=1)
    assert torch.equal(a, torch.ones(3, 1, 4, 4))
    b1 = draw_noise((3, 8, 8), samples=2, seed=5)
    b2 = draw_noise((3, 8, 8), samples=2, seed=5)
    assert torch.equal(b1, b2) and not torch.equal(b1, draw_noise((3, 8, 8), samples=2, seed=6))
    with pytest.raises(ConfigError, match=r"noise\.samples"):
        draw_noise((1, 2, 2), samples=0, seed=0)
    with pytest.raises(ConfigError, match=r"noise\.std"):
        draw_noise((1, 2, 2), std=-1.0, seed=0)
    with pytest.raises(ValueError, match="seed is unset"):  # FAFI gives the run's own seed
        NoiseSpec(samples=1).draw((1, 2, 2))


def test_bad_construction_is_refused() -> None:
    pred, x = _case()
    with pytest.raises(ConfigError, match="fusion"):
        IFFIPredictor(list(pred.extractors), pred.prototypes, fusion="max")
    with pytest.raises(ValueError, match="noise"):
        IFFIPredictor(list(pred.extractors), pred.prototypes, fusion="iffi")
    bad = IFFIPredictor(list(pred.extractors), torch.randn(2, 3), fusion="average")
    with pytest.raises(ValueError, match="dimension"):
        bad(x)


def test_median_fusion_resists_one_hostile_extractor() -> None:
    """Three honest extractors and one boosted, sign-flipped one: the mean is
    dragged to the wrong class, the coordinate-wise median is not."""
    honest = [_linear([[1.0, 0.0], [0.0, 1.0]]), _linear([[1.1, 0.0], [0.0, 0.9]])]
    honest.append(_linear([[0.9, 0.1], [0.0, 1.0]]))
    hostile = _linear([[-100.0, 0.0], [0.0, 100.0]])
    protos = [torch.tensor([[1.0, 0.0], [0.0, 1.0]])] * 3 + [torch.tensor([[1.0, 0.0], [0, 50]])]
    x = torch.tensor([[[[1.0, 0.1]]]])  # class 0 for every honest extractor
    median = IFFIPredictor([*honest, hostile], median_prototypes(protos), fusion="median")
    mean = IFFIPredictor([*honest, hostile], global_prototypes(protos), fusion="average")
    assert median(x).argmax(1).item() == 0 and mean(x).argmax(1).item() == 1
    fused = median.fused_features(x)[0]
    honest_feats = torch.stack([e(x)[0] for e in honest])
    assert bool((fused >= honest_feats.min(0).values).all() and (fused <= 100).all())


def test_median_prototypes_skip_classes_a_client_lacks() -> None:
    a = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # client a holds class 0 only
    b = torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    c = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    p = median_prototypes([a, b, c])
    assert torch.equal(p, torch.tensor([[2.0, 2.0], [5.0, 6.0]]))
    assert torch.equal(median_prototypes([torch.zeros(1, 2)] * 2), torch.zeros(1, 2))


def test_median_prototypes_resist_an_attacker_only_where_three_clients_hold_the_class(
    caplog,
) -> None:
    """An attacker that sends a boosted, flipped row for every class. Class 0
    has two honest holders (three rows with the attacker's): the median stays
    among the honest rows. Class 1 has one honest holder (two rows): a median
    of two is their mean, so the row is the holders' mean, flipped, and the
    warning names that class alone; the code's claim is only for the first."""
    from osfl.methods.fafi.fusion import MEDIAN_MIN_HOLDERS

    assert MEDIAN_MIN_HOLDERS == 3
    honest_a = torch.tensor([[1.0, 0.2], [0.0, 0.0]])
    honest_b = torch.tensor([[0.8, 0.1], [0.3, 1.0]])
    attacker = torch.tensor([[-10.0, -2.0], [-3.0, -10.0]])
    with caplog.at_level("WARNING", logger="osfl.methods.fafi.fusion"):
        p = median_prototypes([honest_a, torch.zeros(2, 2), honest_b, attacker])
    assert torch.equal(p[0], torch.tensor([0.8, 0.1]))  # the middle of three rows
    torch.testing.assert_close(p[1], (honest_b[1] + attacker[1]) / 2)
    assert float(torch.nn.functional.cosine_similarity(p[1], honest_b[1], dim=0)) < -0.99
    assert "classes [1] have fewer than 3 holders" in caplog.text


def test_median_prototypes_of_three_or_more_holders_are_medians_without_a_warning(
    caplog,
) -> None:
    rows = [torch.tensor([[float(v), 1.0]]) for v in (1, 2, 9)]
    with caplog.at_level("WARNING", logger="osfl.methods.fafi.fusion"):
        assert torch.equal(median_prototypes(rows), torch.tensor([[2.0, 1.0]]))
        assert torch.equal(median_prototypes(rows[:2]), torch.tensor([[1.5, 1.0]]))
    assert caplog.text.count("fewer than 3 holders") == 1
