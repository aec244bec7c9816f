"""Least squares on the probability simplex, and integer rounding of its solution.

RLU [Chen & Vikalo, "Recovering Labels from Local Updates in Federated
Learning", ICML 2024, Eq. 10] estimates the label proportions ``z`` of the
samples a client trained on by

    min_z ||A z - u||²   s.t.  z >= 0,  sum(z) = 1

(the paper also writes ``z <= 1``, which the other two constraints imply).
The RLU public code replaces this by a per-class closed form (docs/design.md §8);
we solve the constrained problem itself.

Solver (:func:`simplex_lstsq`): scipy's NNLS [Lawson & Hanson 1974] on the
system augmented with a heavily weighted ``Σz = 1`` row finds the support;
the equality-constrained problem on that support is solved exactly through
its KKT system and certified optimal by the KKT conditions of the full
problem (convex, so a KKT point is the minimiser); if certification fails,
an accelerated projected-gradient polish (FISTA, Beck & Teboulle 2009) whose
every iterate is the exact Euclidean projection onto the simplex [Duchi et
al., ICML 2008] takes over. A final projection makes the constraints hold
*exactly* (``z >= 0``, ``sum(z) == 1`` up to one float rounding). SLSQP, the
obvious scipy choice, took seconds to tens of seconds at 100 classes
(benchmarks/bench_attacks.py); this path takes milliseconds.

Rounding: RLU needs integer counts that sum to the number of labels
``m * |B|``. The paper floors ``|B| z`` (Alg. 1, line 11), which in general
loses labels; we use the largest-remainder (Hamilton) rule instead: floor
``total * z``, then give one more to the classes with the largest fractional
parts until the total is met (ties go to the lower class index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from osfl.errors import ConfigError


@dataclass(frozen=True)
class SimplexSolution:
    """``z`` on the simplex, its residual ``||A z - u||``, and how it was found
    (``certified``: the KKT solve on the NNLS support was optimal; otherwise
    ``polish_iters`` FISTA steps)."""

    z: np.ndarray
    residual: float
    certified: bool
    polish_iters: int


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{z >= 0, sum z = 1}`` (Duchi et al. 2008, Fig. 1).

    Sort, find the largest ``k`` with ``v_(k) - (cumsum_k - 1)/k > 0``, shift by
    that threshold and clip at zero. O(n log n), exact.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    n = v.size
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    idx = np.arange(1, n + 1)
    cond = u - css / idx > 0
    k = idx[cond][-1]
    theta = css[k - 1] / k
    z = np.maximum(v - theta, 0.0)
    # one renormalisation absorbs the last float rounding of the threshold
    return z / z.sum()


def _check_inputs(A: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(A, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64).ravel()
    if A.ndim != 2 or A.shape[0] != u.size:
        raise ConfigError(
            f"simplex least squares: A must be 2-D with as many rows as u has entries; "
            f"got A {A.shape}, u {u.shape}"
        )
    if A.shape[1] < 1:
        raise ConfigError("simplex least squares: A needs at least one column")
    if not (np.isfinite(A).all() and np.isfinite(u).all()):
        raise ConfigError("simplex least squares: A and u must be finite (NaN/Inf found)")
    return A, u


def _kkt_on_support(
    Q: np.ndarray, c: np.ndarray, support: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """Minimiser of ``½ zᵀQz − cᵀz`` with ``Σz = 1`` and ``z = 0`` off ``support``.

    Solves the KKT system ``[[Q_PP, 1], [1ᵀ, 0]] [z_P; λ] = [c_P; 1]``;
    ``None`` when it is singular.
    """
    P = np.flatnonzero(support)
    n = P.size
    K = np.zeros((n + 1, n + 1))
    K[:n, :n] = Q[np.ix_(P, P)]
    K[:n, n] = 1.0
    K[n, :n] = 1.0
    rhs = np.concatenate([c[P], [1.0]])
    try:
        sol = np.linalg.solve(K, rhs)
    except np.linalg.LinAlgError:
        return None
    z = np.zeros(Q.shape[0])
    z[P] = sol[:n]
    return z, float(sol[n])


def _is_kkt_point(Q: np.ndarray, c: np.ndarray, z: np.ndarray, lam: float, tol: float) -> bool:
    """Stationarity ``Qz − c + λ1 − μ = 0`` with ``μ ≥ 0``, ``μ_i z_i = 0``, ``z ≥ 0``."""
    if (z < 0).any():
        return False
    mu = Q @ z - c + lam
    scale = tol * max(1.0, float(np.abs(c).max()), abs(lam))
    return bool((mu[z > 0] ** 2).sum() ** 0.5 <= scale * z.size and (mu[z == 0] >= -scale).all())


def simplex_lstsq(
    A: np.ndarray,
    u: np.ndarray,
    *,
    polish_iters: int = 5000,
    tol: float = 1e-9,
) -> SimplexSolution:
    """``argmin ||A z − u||²`` over the probability simplex (RLU Eq. 10).

    0. if the equality-constrained optimum over all classes is non-negative
       it is the answer (one linear solve);
    1. else scipy's NNLS (Lawson–Hanson) on the system augmented with a heavily
       weighted row ``w·1ᵀz = w`` finds the support of the solution;
    2. the equality-constrained least squares on that support is solved
       exactly (its KKT system) and accepted if it satisfies every KKT
       condition of the full problem (``z ≥ 0``, multipliers of the zero
       entries ≥ 0), which makes it *the* minimiser (the problem is convex);
    3. otherwise an accelerated projected-gradient polish (FISTA) from the
       projected NNLS point, every iterate an exact simplex projection.

    The result is finally projected onto the simplex, so ``z ≥ 0`` holds
    exactly and ``Σz = 1`` to one rounding. The problem is rescaled by
    ``max|A|`` first, so that tolerances mean the same for an untrained model
    (entries ~0.1) and a trained one (~1e-4). ``certified`` in the result
    records whether step 2 certified the solution.
    """
    A, u = _check_inputs(A, u)
    n = A.shape[1]
    scale = float(np.abs(A).max())
    if scale == 0.0:
        # Every z fits equally well; the uniform split is the least-informative answer.
        z = np.full(n, 1.0 / n)
        return SimplexSolution(z, float(np.linalg.norm(u)), True, 0)
    As, us = A / scale, u / scale
    Q = As.T @ As
    c = As.T @ us

    full = _kkt_on_support(Q, c, np.ones(n, dtype=bool))  # interior optimum: one solve
    if full is not None and _is_kkt_point(Q, c, *full, tol=tol):
        z = project_simplex(full[0])
        return SimplexSolution(z, float(np.linalg.norm(A @ z - u)), True, 0)
    w = 1e3 * max(1.0, float(np.linalg.norm(As, 2)))
    z0, _ = nnls(np.vstack([As, w * np.ones((1, n))]), np.concatenate([us, [w]]), maxiter=50 * n)
    z = project_simplex(z0 if z0.sum() > 0 else np.ones(n))
    certified, it = False, 0
    kkt = _kkt_on_support(Q, c, z0 > 0)
    if kkt is not None and _is_kkt_point(Q, c, *kkt, tol=tol):
        z, certified = project_simplex(kkt[0]), True
    elif n > 1:
        z, it = _fista(Q, c, z, polish_iters, tol * 1e-3)
    return SimplexSolution(z, float(np.linalg.norm(A @ z - u)), certified, it)


def _fista(
    Q: np.ndarray, c: np.ndarray, z: np.ndarray, iters: int, tol: float
) -> tuple[np.ndarray, int]:
    """FISTA on the simplex (Beck & Teboulle 2009), step 1/L, best iterate kept."""
    lip = float(np.linalg.eigvalsh(Q)[-1])
    if lip <= 0:
        return z, 0

    def f(v: np.ndarray) -> float:
        return 0.5 * float(v @ Q @ v) - float(c @ v)

    step = 1.0 / lip
    y, t, z_prev = z.copy(), 1.0, z.copy()
    best, best_f, it = z.copy(), f(z), 0
    for k in range(1, iters + 1):
        it = k
        z_new = project_simplex(y - step * (Q @ y - c))
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = z_new + ((t - 1.0) / t_new) * (z_new - z_prev)
        fz = f(z_new)
        if fz < best_f:
            best, best_f = z_new.copy(), fz
        moved = float(np.abs(z_new - z_prev).max())
        z_prev, t = z_new, t_new
        if moved < tol:
            break
    return best, it


def largest_remainder(z: np.ndarray, total: int) -> np.ndarray:
    """Integer counts ``>= 0`` summing to ``total`` that are closest to ``total * z``.

    Hamilton's rule: floor, then +1 to the largest remainders (ties: lower
    index first). ``z`` is clipped at 0 and renormalised, so any non-negative
    weight vector works; an all-zero ``z`` is split uniformly.
    """
    if total < 0 or int(total) != total:
        raise ConfigError(f"total must be a non-negative integer, got {total}")
    w = np.clip(np.asarray(z, dtype=np.float64).ravel(), 0.0, None)
    if not np.isfinite(w).all():
        raise ConfigError("largest_remainder: weights must be finite")
    s = w.sum()
    w = np.full(w.size, 1.0 / w.size) if s <= 0 else w / s
    raw = w * int(total)
    counts = np.floor(raw).astype(np.int64)
    short = int(total) - int(counts.sum())
    if short > 0:
        frac = raw - counts
        order = np.lexsort((np.arange(w.size), -frac))  # largest remainder, then lowest index
        counts[order[:short]] += 1
    return counts
