"""FedCGS's closed-form head and its screen of client statistics, exactly, at
their edges (tests that mutation testing showed were missing: TESTING.md):
a class with one sample, two samples in all, identical features, a rank-
deficient covariance, and statistics forged within and beyond the screen's
tolerance. The head is compared with the Gaussian classifier computed
directly from the features (Eqs. of the module docstring)."""

from __future__ import annotations

import math

import pytest
import torch

from osfl.errors import ConfigError
from osfl.methods.fedcgs import (
    ABSENT_CLASS_BIAS,
    MAX_STATISTIC,
    client_statistics,
    lda_head,
    statistics_problem,
)


def direct_head(f: torch.Tensor, y: torch.Tensor, classes: int, shrinkage: float, covariance: str):
    """μ_c Σ̂⁻¹ and −½ μ_c Σ̂⁻¹ μ_c + log(n_c / n) from the features themselves."""
    n, d = f.shape
    present = [c for c in range(classes) if (y == c).any()]
    mu = torch.zeros(classes, d, dtype=torch.float64)
    for c in present:
        mu[c] = f[y == c].mean(0)
    if covariance == "total":
        sigma = torch.cov(f.T, correction=1) if n > 1 else torch.zeros(d, d, dtype=torch.float64)
    else:
        scatter = sum((f[y == c] - mu[c]).T @ (f[y == c] - mu[c]) for c in present)
        dof = n - len(present)
        sigma = scatter / dof if dof >= 1 else torch.zeros(d, d, dtype=torch.float64)
    spread = float(torch.trace(sigma)) / d
    sigma_hat = sigma + shrinkage * (spread if spread > 0 else 1.0) * torch.eye(
        d, dtype=torch.float64
    )
    w = torch.linalg.solve(sigma_hat, mu.T).T
    b = torch.full((classes,), ABSENT_CLASS_BIAS, dtype=torch.float64)
    for c in present:
        b[c] = -0.5 * mu[c] @ w[c] + math.log(int((y == c).sum()) / n)
    return w, b


def head_of(f: torch.Tensor, y: torch.Tensor, classes: int, shrinkage: float, covariance: str):
    st = client_statistics(f, y, classes)
    return lda_head(st["class_sums"], st["class_counts"], st["second_moment"],
                    shrinkage=shrinkage, covariance=covariance)  # fmt: skip


@pytest.mark.parametrize("covariance", ["total", "within"])
def test_head_equals_the_direct_computation_with_a_singleton_and_an_absent_class(covariance):
    g = torch.Generator().manual_seed(0)
    f = torch.randn(9, 3, dtype=torch.float64, generator=g)
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])  # class 2 has one sample, class 3 none
    w, b = head_of(f, y, 4, 0.1, covariance)
    w_ref, b_ref = direct_head(f, y, 4, 0.1, covariance)
    torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b, b_ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(w[3], torch.zeros(3, dtype=torch.float64)) and b[3] == ABSENT_CLASS_BIAS


def test_two_samples_already_have_a_spread():
    """n = 2 estimates a covariance (n − 1 = 1); only n = 1 has none."""
    f = torch.tensor([[0.0, 1.0], [2.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    w, b = head_of(f, y, 2, 0.5, "total")
    w_ref, b_ref = direct_head(f, y, 2, 0.5, "total")
    torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b, b_ref, rtol=1e-12, atol=1e-12)


def test_identical_features_get_a_unit_ridge():
    """No spread at all: the ridge is ``shrinkage`` times the identity, so
    W = μ_c / shrinkage."""
    f = torch.ones(4, 2, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    w, _ = head_of(f, y, 2, 0.25, "total")
    torch.testing.assert_close(w, torch.full((2, 2), 4.0, dtype=torch.float64), rtol=0, atol=0)


def test_a_rank_deficient_covariance_is_refused_with_the_fix():
    """Features in a plane of R³ (one eigenvalue of Σ is zero, the others
    not): without a ridge the head does not exist, and the error says which
    option to raise."""
    g = torch.Generator().manual_seed(1)
    plane = torch.randn(12, 2, dtype=torch.float64, generator=g)
    f = torch.cat([plane, plane.sum(1, keepdim=True)], 1)
    y = torch.arange(12) % 2
    message = ("fedcgs: the feature covariance is singular (fewer samples than feature "
               "dimensions, or collinear features); raise method.fedcgs.shrinkage (now 0.0)")  # fmt: skip
    with pytest.raises(ConfigError) as e:
        head_of(f, y, 2, 0.0, "total")
    assert str(e.value) == message


def _stats(f: torch.Tensor, y: torch.Tensor, classes: int):
    st = client_statistics(f, y, classes)
    return st["class_sums"], st["class_counts"].tolist(), st["second_moment"]


def test_the_screen_names_what_no_features_can_produce():
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1])
    sums, counts, second = _stats(f, y, 3)
    assert statistics_problem(sums, counts, second) is None
    ghost = sums.clone()
    ghost[2] = 1.0
    assert statistics_problem(ghost, counts, second) == (
        "class_sums: a nonzero sum for a class with no samples"
    )
    big = sums.clone()
    big[0, 0] = 2 * MAX_STATISTIC
    assert statistics_problem(big, counts, second) == f"class_sums: values beyond {MAX_STATISTIC:g}"
    huge = second.clone()
    huge[1, 1] = 2 * MAX_STATISTIC
    assert (
        statistics_problem(sums, counts, huge) == f"second_moment: values beyond {MAX_STATISTIC:g}"
    )


def test_the_singleton_class_counts_in_the_scatter():
    """Class 0 has one sample f = e1: a B without its f fᵀ is smaller than
    the class sums allow (one negative direction), and is refused."""
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    sums, counts, second = _stats(f, torch.tensor([0, 1, 1]), 2)
    forged = second - torch.outer(f[0], f[0])
    assert statistics_problem(sums, counts, forged) == (
        "second_moment is smaller than the class sums allow (not Σ f fᵀ of any features)"
    )


def test_the_screens_tolerances_are_relative_to_the_trace_plus_one():
    """Zero within-class scatter (each class's samples equal): B may fall short
    by up to 1e-8 (trace + 1) in a direction, and B may be asymmetric by up
    to 1e-9 (trace + 1), not more."""
    f = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    sums, counts, second = _stats(f, torch.tensor([0, 0, 1]), 2)
    scale = float(second.diagonal().sum()) + 1.0
    assert statistics_problem(sums, counts, second - 5e-9 * scale * torch.eye(2)) is None
    assert statistics_problem(sums, counts, second - 0.5 * scale * torch.eye(2)) is not None
    zero = torch.zeros(2, 2, dtype=torch.float64)
    none = torch.zeros(2, 2, dtype=torch.float64)
    at_bound, beyond = zero.clone(), zero.clone()
    at_bound[0, 1], beyond[0, 1] = 1e-9, 1.5e-9  # trace 0: the bound is 1e-9 exactly
    assert statistics_problem(none, [0, 0], at_bound) != "second_moment is not symmetric"
    assert statistics_problem(none, [0, 0], beyond) == "second_moment is not symmetric"


@pytest.mark.parametrize(
    ("y", "covariance"),
    [([0], "total"), ([0, 1, 1], "within"), ([0, 1], "within")],
    ids=["one sample", "within, one degree of freedom", "within, none"],
)
def test_the_smallest_samples_follow_the_direct_computation(y, covariance):
    """One sample has no spread (a unit ridge); the within-class covariance
    with n − K = 1 divides by 1, and with n − K = 0 has no spread either."""
    f = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]], dtype=torch.float64)[: len(y)]
    labels = torch.tensor(y)
    w, b = head_of(f, labels, 2, 0.5, covariance)
    w_ref, b_ref = direct_head(f, labels, 2, 0.5, covariance)
    torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b, b_ref, rtol=1e-12, atol=1e-12)


def test_singularity_is_judged_against_the_largest_eigenvalue():
    """Σ̂ with eigenvalues 1e-14, 1 and 100 (no ridge): the smallest is below
    d · eps · 100 (so refused), though above d · eps · 1."""
    n = 5
    second = torch.diag(torch.tensor([1e-14, 1.0, 100.0], dtype=torch.float64)) * (n - 1)
    sums = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ConfigError, match="singular"):
        lda_head(sums, torch.tensor([2, 3]), second, shrinkage=0.0)


def test_statistics_at_the_bound_and_asymmetry_within_a_larger_tolerance_pass():
    """A value of exactly MAX_STATISTIC is allowed; the asymmetry tolerance
    grows with the trace (here 10 + 1: 5.5e-9 passes)."""
    f = torch.tensor([[1.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    sums, counts, second = _stats(f, torch.tensor([0, 1]), 2)
    edge = sums.clone()
    edge[0, 1] = MAX_STATISTIC
    assert (
        statistics_problem(edge, counts, second) != f"class_sums: values beyond {MAX_STATISTIC:g}"
    )
    skew = second.clone()
    skew[0, 1] += 5.5e-9
    assert statistics_problem(sums, counts, skew) is None
