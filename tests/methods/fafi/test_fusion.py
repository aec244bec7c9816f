"""FAFI's IFFI (Eq. 8-10) on a tiny constructed case worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.fafi.fusion import (
    MEDIAN_MIN_HOLDERS,
    IFFIPredictor,
    NoiseSpec,
    draw_noise,
    fuse,
    global_prototypes,
    iffi_weights,
    median_prototypes,
    unprotected_classes,
    warn_unprotected,
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
    counts = torch.ones(4, 2, dtype=torch.long)  # everyone holds both classes
    x = torch.tensor([[[[1.0, 0.1]]]])  # class 0 for every honest extractor
    median = IFFIPredictor([*honest, hostile], median_prototypes(protos, counts), fusion="median")
    mean = IFFIPredictor([*honest, hostile], global_prototypes(protos), fusion="average")
    assert median(x).argmax(1).item() == 0 and mean(x).argmax(1).item() == 1
    fused = median.fused_features(x)[0]
    honest_feats = torch.stack([e(x)[0] for e in honest])
    assert bool((fused >= honest_feats.min(0).values).all() and (fused <= 100).all())


def test_median_prototypes_count_holders_by_class_counts_not_by_non_zero_rows() -> None:
    """Learned prototypes: every client sends a non-zero, trained row for every
    class, so only the uploaded class counts say who holds a class. Class 0:
    clients a and c hold it, so its row is their mean (b's row, trained only
    as a negative, is left out); class 1: a, b, c all hold it -> the median."""
    a = torch.tensor([[1.0, 2.0], [7.0, 0.0]])
    b = torch.tensor([[-9.0, -9.0], [5.0, 6.0]])  # b never saw class 0
    c = torch.tensor([[3.0, 0.0], [1.0, 4.0]])
    counts = torch.tensor([[4, 1], [0, 9], [2, 3]])
    p = median_prototypes([a, b, c], counts)
    assert torch.equal(p, torch.tensor([[2.0, 1.0], [5.0, 4.0]]))
    assert torch.equal(
        median_prototypes([torch.ones(1, 2)] * 2, torch.zeros(2, 1)), torch.zeros(1, 2)
    )
    with pytest.raises(ValueError, match="do not match"):
        median_prototypes([a, b, c], counts[:2])


def test_median_prototypes_resist_an_attacker_only_where_three_clients_hold_the_class() -> None:
    """Learned prototypes (every row non-zero) and an attacker that sends a
    boosted, flipped row for every class and claims both. Class 0 has two
    honest holders (three holders with the attacker): the median stays among
    the honest rows. Class 1 has one honest holder (two holders): a median of
    two is their mean, so the row is the holders' mean, flipped, and only
    class 1 is unprotected."""
    assert MEDIAN_MIN_HOLDERS == 3
    honest_a = torch.tensor([[1.0, 0.2], [0.5, 0.5]])
    bystander = torch.tensor([[0.4, 0.4], [-20.0, 20.0]])  # trained on neither class's data
    honest_b = torch.tensor([[0.8, 0.1], [0.3, 1.0]])
    attacker = torch.tensor([[-10.0, -2.0], [-3.0, -10.0]])
    counts = torch.tensor([[5, 0], [0, 0], [2, 7], [3, 3]])
    p = median_prototypes([honest_a, bystander, honest_b, attacker], counts)
    assert torch.equal(p[0], torch.tensor([0.8, 0.1]))  # the middle of three rows
    torch.testing.assert_close(p[1], (honest_b[1] + attacker[1]) / 2)
    assert float(torch.nn.functional.cosine_similarity(p[1], honest_b[1], dim=0)) < -0.99
    assert unprotected_classes(counts) == [1]


def test_median_prototypes_of_three_or_more_holders_are_medians() -> None:
    rows = [torch.tensor([[float(v), 1.0]]) for v in (1, 2, 9)]
    counts = torch.ones(3, 1, dtype=torch.long)
    assert torch.equal(median_prototypes(rows, counts), torch.tensor([[2.0, 1.0]]))
    assert torch.equal(median_prototypes(rows[:2], counts[:2]), torch.tensor([[1.5, 1.0]]))


def test_warn_unprotected_names_the_classes_with_one_or_two_holders(caplog) -> None:
    """The warning the server logs while it aggregates (so the run's record
    keeps it): classes held by one or two clients; none for three holders or
    for a class nobody holds."""
    counts = torch.tensor([[1, 1, 0, 1], [0, 1, 0, 1], [0, 0, 0, 1]])
    with caplog.at_level("WARNING", logger="osfl.methods.fafi.fusion"):
        assert warn_unprotected(counts) == [0, 1]
        assert warn_unprotected(counts[:, 3:]) == []
    assert caplog.text.count("fewer than 3 holders") == 1
    assert "classes [0, 1] have fewer than 3 holders" in caplog.text
