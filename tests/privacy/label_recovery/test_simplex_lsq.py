"""RLU's Eq. 10 solver beyond its main path (``simplex_lsq.py``): the FISTA
polish that takes over when the KKT solve on the NNLS support is not
certified, the degenerate inputs (one class, an all-zero matrix, a singular
KKT system), the exact projection and rounding rules, and the exact
refusals. Every minimiser is checked against the certified solution of the
same convex problem or against values by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from osfl.errors import ConfigError
from osfl.privacy.label_recovery import simplex_lsq
from osfl.privacy.label_recovery.simplex_lsq import (
    _fista,
    _is_kkt_point,
    _kkt_on_support,
    largest_remainder,
    project_simplex,
    simplex_lstsq,
)


def _problem(seed: int, n: int = 6, m: int = 9):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(m, n))
    u = rng.normal(size=m) * 2
    return A, u


def _objective(A, u, z) -> float:
    return float(np.linalg.norm(A @ z - u))


@pytest.mark.parametrize("seed", range(4))
def test_fista_reaches_the_certified_minimiser(seed):
    A, u = _problem(seed)
    best = simplex_lstsq(A, u)
    assert best.certified and best.polish_iters == 0
    Q, c = A.T @ A, A.T @ u
    start = np.full(6, 1 / 6)
    z, it = _fista(Q, c, start, 20000, 1e-13)
    assert 1 < it < 20000  # stopped by the tolerance
    np.testing.assert_allclose(z, best.z, atol=1e-6)
    assert (z >= 0).all() and z.sum() == pytest.approx(1.0, abs=1e-12)
    few, _ = _fista(Q, c, start, 3, 0.0)
    assert _objective(A, u, few) <= _objective(A, u, start)  # the best iterate, never worse
    assert _fista(Q, c, start, 3, 0.0)[1] == 3


def _reference_fista(Q, c, z0, iters):
    """FISTA as Beck & Teboulle (2009) write it (their Eqs. 4.1-4.3) with the
    simplex projection as the proximal step and step 1/L, L = λmax(Q); the
    best iterate by objective is returned, as osfl keeps it."""
    f = lambda v: 0.5 * v @ Q @ v - c @ v  # noqa: E731
    step = 1.0 / np.linalg.eigvalsh(Q).max()
    x_prev, y, t = z0.copy(), z0.copy(), 1.0
    best = z0.copy()
    for _ in range(iters):
        x = project_simplex(y - step * (Q @ y - c))
        t_next = (1.0 + np.sqrt(1.0 + 4.0 * t**2)) / 2.0
        y = x + (t - 1.0) / t_next * (x - x_prev)
        best = x.copy() if f(x) < f(best) else best
        x_prev, t = x, t_next
    return best


@pytest.mark.parametrize("scale", [3.0, 0.4])  # λmax(Q) above and below 1
@pytest.mark.parametrize("iters", [1, 2, 7])
def test_fista_iterates_are_beck_and_teboulles(scale, iters):
    """Step, momentum and best-iterate rule equal the paper's FISTA, iterate
    for iterate (the convergence test alone cannot see a wrong momentum)."""
    A, u = _problem(11)
    Q, c = A.T @ A, A.T @ u
    Q, c = scale * Q / np.linalg.eigvalsh(Q).max(), scale * c / np.linalg.eigvalsh(Q).max()
    start = np.full(6, 1 / 6)
    z, it = _fista(Q, c, start, iters, -1.0)  # a negative tolerance never stops it
    assert it == iters
    np.testing.assert_allclose(z, _reference_fista(Q, c, start, iters), rtol=0, atol=1e-13)


def test_fista_stops_only_when_an_iterate_moves_less_than_the_tolerance():
    """At a vertex the iterates stop moving (moved == 0): tolerance 0 never
    stops the loop, any positive one stops it there; no iterations, count 0."""
    Q, c = np.eye(3), np.array([10.0, 0.0, 0.0])  # the minimiser is the vertex e0
    start = np.full(3, 1 / 3)
    z, it = _fista(Q, c, start, 12, 0.0)
    assert it == 12 and np.array_equal(z, [1.0, 0.0, 0.0])
    assert _fista(Q, c, start, 12, 1e-12)[1] < 12
    assert _fista(Q, c, start, 0, 0.0)[1] == 0


def test_fista_without_curvature_returns_its_start():
    z0 = np.array([0.5, 0.5])
    z, it = _fista(np.zeros((2, 2)), np.ones(2), z0, 100, 1e-9)
    assert it == 0 and z is z0


def test_the_polish_takes_over_when_the_kkt_solve_is_not_certified(monkeypatch):
    A, u = _problem(7)
    best = simplex_lstsq(A, u)
    monkeypatch.setattr(simplex_lsq, "_is_kkt_point", lambda *a, **k: False)
    sol = simplex_lstsq(A, u, polish_iters=20000)
    assert not sol.certified and sol.polish_iters > 1
    np.testing.assert_allclose(sol.z, best.z, atol=1e-5)
    assert sol.residual == pytest.approx(_objective(A, u, sol.z), rel=1e-12)
    assert sol.residual == pytest.approx(best.residual, rel=1e-6)
    one = simplex_lstsq(A[:, :1], u)  # one class: nothing to polish
    assert one.z.tolist() == [1.0] and one.polish_iters == 0


def test_the_nnls_support_is_solved_exactly_when_the_optimum_is_on_a_face():
    """u far outside the image of the simplex: the optimum has zeros; NNLS finds
    the support, the KKT solve on it is certified without any polish."""
    A = np.eye(3)
    sol = simplex_lstsq(A, np.array([2.0, 1.5, -3.0]))
    assert sol.certified and sol.polish_iters == 0
    np.testing.assert_allclose(sol.z, [0.75, 0.25, 0.0], atol=1e-12)
    assert sol.residual == pytest.approx(np.linalg.norm([1.25, 1.25, 3.0]), rel=1e-12)


def test_an_all_zero_matrix_gives_the_uniform_split():
    sol = simplex_lstsq(np.zeros((3, 4)), np.array([3.0, 0.0, 4.0]))
    assert (
        sol.z.tolist() == [0.25] * 4
        and sol.residual == 5.0
        and sol.certified
        and sol.polish_iters == 0
    )


def test_kkt_on_a_support():
    Q, c = np.diag([2.0, 4.0, 1.0]), np.array([1.0, 1.0, -1.0])
    z, lam = _kkt_on_support(Q, c, np.array([True, True, False]))
    # min ½(2a² + 4b²) − a − b, a + b = 1: 2a − 1 + λ = 0, 4b − 1 + λ = 0 -> a = 2/3, b = 1/3
    np.testing.assert_allclose(z, [2 / 3, 1 / 3, 0.0], atol=1e-12)
    assert lam == pytest.approx(-1 / 3)
    assert _is_kkt_point(Q, c, z, lam, 1e-9)
    assert not _is_kkt_point(Q, c, np.array([1.0, 0.0, 0.0]), 0.0, 1e-9)
    assert not _is_kkt_point(Q, c, np.array([1.5, -0.5, 0.0]), lam, 1e-9)  # negative entry
    # the zero entry's multiplier must be >= 0: with c_2 = 1, Qz − c + λ at class 2 is −4/3
    c2 = np.array([1.0, 1.0, 1.0])
    assert not _is_kkt_point(Q, c2, z, lam, 1e-9)
    assert _kkt_on_support(np.zeros((2, 2)), np.zeros(2), np.array([True, True])) is None


def test_projection_onto_the_simplex():
    np.testing.assert_allclose(project_simplex(np.array([0.5, 0.5, 0.5])), [1 / 3] * 3, atol=1e-15)
    np.testing.assert_allclose(project_simplex(np.array([3.0, 1.0])), [1.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([-1.0, -2.0])), [1.0, 0.0])
    np.testing.assert_allclose(
        project_simplex(np.array([0.4, 0.1, 0.3])), np.array([0.4, 0.1, 0.3]) + 0.2 / 3, atol=1e-15
    )
    z = project_simplex(np.array([[0.2, 0.9], [0.1, 0.3]]))  # flattened
    assert z.shape == (4,) and z.sum() == pytest.approx(1.0) and (z >= 0).all()


def test_largest_remainder_rules():
    assert largest_remainder(np.array([1.0, 1.0, 2.0]), 4).tolist() == [
        1,
        1,
        2,
    ]  # weights, not proportions
    assert largest_remainder(np.array([-1.0, 1.0, 1.0]), 3).tolist() == [
        0,
        2,
        1,
    ]  # clipped; tie -> lower
    assert largest_remainder(np.zeros(3), 4).tolist() == [2, 1, 1]  # all zero: uniform
    assert largest_remainder(np.array([0.6, 0.4]), 0).tolist() == [0, 0]
    assert largest_remainder(np.array([[0.5], [0.5]]), 3).tolist() == [2, 1]
    got = largest_remainder(np.array([0.3, 0.3, 0.4]), 10)
    assert got.tolist() == [3, 3, 4] and got.dtype == np.int64
    for bad, msg in [
        (-1, "total must be a non-negative integer, got -1"),
        (2.5, "total must be a non-negative integer, got 2.5"),
    ]:
        with pytest.raises(ConfigError) as e:
            largest_remainder(np.ones(2), bad)
        assert str(e.value) == msg
    with pytest.raises(ConfigError) as e:
        largest_remainder(np.array([1.0, np.inf]), 2)
    assert str(e.value) == "largest_remainder: weights must be finite"


def test_refusals():
    cases = [
        (
            np.ones((3, 2)),
            np.ones(4),
            "simplex least squares: A must be 2-D with as many rows as u has entries; got A (3, 2), u (4,)",
        ),
        (
            np.ones(3),
            np.ones(3),
            "simplex least squares: A must be 2-D with as many rows as u has entries; got A (3,), u (3,)",
        ),
        (np.ones((3, 0)), np.ones(3), "simplex least squares: A needs at least one column"),
        (
            np.array([[np.nan, 1.0]]),
            np.ones(1),
            "simplex least squares: A and u must be finite (NaN/Inf found)",
        ),
        (
            np.ones((1, 2)),
            np.array([np.inf]),
            "simplex least squares: A and u must be finite (NaN/Inf found)",
        ),
    ]
    for A, u, msg in cases:
        with pytest.raises(ConfigError) as e:
            simplex_lstsq(A, u)
        assert str(e.value) == msg
