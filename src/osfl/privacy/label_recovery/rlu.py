"""RLU: Recovering Labels from Local Updates.

Chen & Vikalo, "Recovering Labels from Local Updates in Federated Learning",
ICML 2024: §3.2 (Eqs. 6–14), §3.3 (Eq. 16, Table 1), Appendix C.1 (Alg. 1)
and C.2 (Alg. 2). Implemented from the paper, not from its public code, which
(docs/design.md §8) replaces the constrained least squares by a per-class closed
form, passes a learning rate where the momentum belongs and has indexing
bugs.

Algorithm (one Observation, ``m`` local steps of ``|B|`` samples each):

1. Fit ``q ~ N(μ_n, Σ_n)`` to the logits of each class ``n`` of the auxiliary
   set under the global model θ^(t) and (for m > 1) the uploaded local model
   (Assumption 3.1); Monte Carlo ``S[n, j] = E softmax(q)_j`` with ``M``
   samples (Eq. 8); coefficient matrix ``C`` (Alg. 1 lines 2–8).
2. ``u = (Δb + h) / (η Σ_τ ρ(τ))`` with ρ, h from Table 1 (Eq. 16). Dividing by
   ``Σ ρ`` (= m for SGD) puts ``u`` on the scale of one step, so that the
   unknown is the label *proportion* ``z = N / (m|B|)``, which lives on the
   simplex; Alg. 1 feeds ``Δb/η`` directly, which only matches ``z`` on the
   simplex for m = 1 and plain SGD.
3. ``z = argmin ||C z − u||`` on the simplex (Eq. 10; ``C`` from θ^(t) for
   m = 1, the mean of the global and local ``C`` for m > 1, Alg. 1 line 13),
   rounded to counts summing to ``m|B|`` by the largest-remainder rule (the
   paper floors, which loses labels).
4. m > 1: posterior search (Alg. 2, :func:`posterior_search`), with the
   logit-shift factor of Eq. 13 calibrated on the auxiliary set
   (:func:`trunk_gain`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.privacy.label_recovery.base import AttackInputs, LabelAttack, Transform, register_attack
from osfl.privacy.label_recovery.coefficients import LocalDynamics
from osfl.privacy.label_recovery.moments import (
    ConfidenceSampler,
    coefficient_matrix,
    fit_gaussians,
)
from osfl.privacy.label_recovery.schemes import local_dynamics
from osfl.privacy.label_recovery.simplex_lsq import largest_remainder, simplex_lstsq


@dataclass(frozen=True)
class RLUConfig:
    """RLU's options.

    ``num_samples``: M, Monte Carlo draws per class (Eq. 8; the paper gives no
    value). ``posterior_iters``: T of Alg. 2 (10, Appendix B.2.2; 0 turns the
    search off). ``bn_stats``: BatchNorm statistics for the auxiliary logits
    ("batch" as in training, or "running"). ``ridge``: relative covariance
    ridge. ``posterior_criterion``: what Alg. 2 compares, ``"bias"`` (the
    simulated vs the observed bias update, our default) or ``"logits"`` (the
    simulated vs the observed final logit means, Alg. 2 lines 37–41 as
    written; see docs/privacy.md for the measurements behind the default).
    ``seed``: the Monte Carlo draws.
    """

    num_samples: int = 4096
    posterior_iters: int = 10
    bn_stats: str = "batch"
    ridge: float = 1e-6
    posterior_criterion: str = "bias"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ConfigError(f"rlu: num_samples must be >= 1, got {self.num_samples}")
        if self.posterior_iters < 0:
            raise ConfigError(f"rlu: posterior_iters must be >= 0, got {self.posterior_iters}")
        if self.posterior_criterion not in ("logits", "bias"):
            raise ConfigError(
                f"rlu: posterior_criterion must be 'logits' or 'bias', got {self.posterior_criterion!r}"
            )
        if self.bn_stats not in ("batch", "running"):
            raise ConfigError(f"rlu: bn_stats must be 'batch' or 'running', got {self.bn_stats!r}")


def embedding_energy(dW: np.ndarray, db: np.ndarray) -> float:
    """``||ē||² + 1`` with ``ē`` the least-squares solution of ``ΔW_j ≈ Δb_j ē`` over all j.

    Eq. 14 reads ``ē_l ≈ ΔW_{j,l} / Δb_j`` for an unspecified ``j`` (Alg. 2
    line 20 leaves ``j`` free); pooling all rows by least squares,
    ``ē = Σ_j Δb_j ΔW_j / Σ_j Δb_j²``, uses every class. A logit then moves by
    ``ΔW_j·ē + Δb_j = Δb_j (||ē||² + 1)``: Eq. 13's ``Σ_l ē_l²`` plus the bias's
    own ``1``, which Eq. 13 drops.
    """
    denom = float(db @ db)
    if denom <= 0:
        return 1.0
    e = (db @ dW) / denom
    return float(e @ e) + 1.0


def trunk_gain(
    mu_global: np.ndarray,
    mu_local: np.ndarray,
    feats: np.ndarray,
    labels: np.ndarray,
    dW: np.ndarray,
    db: np.ndarray,
) -> float:
    """How much more the logits moved than the output layer alone explains.

    Eq. 13 models only the output layer, but the trunk learns from the same
    gradients and moves the logits in the same direction (on untrained
    LeNet-5 / VGG-16 with m = 10 we measure 2–3.5× the output layer's shift).
    Uncorrected, Alg. 2 reads that surplus as "dominant classes were
    under-counted" and drifts towards them. The gain is the least-squares
    ratio of the observed class-mean logit shift ``μ^(t+1) − μ^(t)`` to the
    shift the output-layer update explains on the same auxiliary samples,
    ``mean_{x ∈ class n} (ΔW e(x) + Δb)``, both centred over classes (softmax
    ignores a common shift). Falls back to 1 when the ratio is not positive.
    """
    K = mu_global.shape[0]
    explained = np.stack([(feats[labels == n] @ dW.T + db).mean(axis=0) for n in range(K)])
    observed = mu_local - mu_global
    explained = explained - explained.mean(axis=1, keepdims=True)
    observed = observed - observed.mean(axis=1, keepdims=True)
    denom = float((explained * explained).sum())
    gain = float((observed * explained).sum()) / denom if denom > 0 else 1.0
    return gain if np.isfinite(gain) and gain > 0 else 1.0


def posterior_search(
    counts: np.ndarray,
    *,
    sampler: ConfidenceSampler,
    mu_local: np.ndarray,
    dyn: LocalDynamics,
    drift: np.ndarray | None,
    steps: int,
    kappa: float,
    iters: int,
    criterion: str = "logits",
    observed_db: np.ndarray | None = None,
) -> tuple[np.ndarray, list[float]]:
    """Alg. 2: refine ``counts`` by simulating the ``m`` local steps.

    For the current guess (per-step proportions ``g = N / (m|B|)``), each
    step τ evaluates ``Ŝ^τ`` at the simulated class means (global covariance,
    Alg. 2 line 28), takes the CE update ``G_τ = η C(Ŝ^τ) g`` (Eq. 12) and
    moves the means by ``κ`` times the bias change so far (Eq. 13), where
    the bias change after ``k`` steps is ``Σ_{τ≤k} ρ_k(τ) G_τ − h_k`` (Table 1
    with ``m → k``; for SGD simply ``Σ G_τ``). The simulated final means are
    compared with the local model's fitted means ``mu_local``: the class
    whose summed logit is most over-predicted gives ``m`` samples to the most
    under-predicted one (lines 37–43). ``criterion="bias"`` compares the
    simulated total bias update with the observed ``Δb`` instead of the
    final logit means: ``Δb`` is exactly what Eq. 16 models, whereas the
    final means also carry the trunk's learning. Two guards the paper leaves implicit:
    the differences are centred over classes (softmax ignores a common
    shift, and feature changes the linear model cannot see shift all logits
    alike), and the best guess seen (smallest mismatch) is returned, so the
    search never ends worse than its start. Returns the counts and the
    mismatch of every iteration.
    """
    counts = np.asarray(counts, dtype=np.int64).copy()
    total = int(counts.sum())
    mu0 = sampler.gauss.mean
    rho_by_k = {k: dyn.rho(k) for k in range(1, steps + 1)}
    h_by_k = {k: dyn.history(drift, k) for k in range(1, steps + 1)}

    if criterion not in ("logits", "bias"):
        raise ConfigError(f"posterior criterion must be 'logits' or 'bias', got {criterion!r}")
    if criterion == "bias" and observed_db is None:
        raise ConfigError("the 'bias' posterior criterion needs the observed bias update")

    def simulate(z: np.ndarray) -> np.ndarray:
        """The simulated total bias change after ``steps`` steps (Eq. 16 along the path)."""
        G: list[np.ndarray] = []
        delta = np.zeros(mu0.shape[1])
        for k in range(1, steps + 1):
            S = sampler.S(mu0 + kappa * delta[None, :])
            G.append(dyn.lr * (coefficient_matrix(S) @ z))
            delta = np.tensordot(rho_by_k[k], np.stack(G), axes=1) - h_by_k[k]
        return delta

    best, best_err, trace = counts.copy(), np.inf, []
    for it in range(iters + 1):
        delta = simulate(counts / total)
        if criterion == "logits":  # Alg. 2 lines 37-41: simulated vs observed final means
            D = (mu0 + kappa * delta[None, :] - mu_local).sum(axis=0)
        else:  # simulated vs observed bias update
            D = delta - observed_db
        D = D - D.mean()
        err = float(np.linalg.norm(D))
        trace.append(err)
        if err < best_err:
            best, best_err = counts.copy(), err
        if it == iters:
            break
        over = np.flatnonzero((D > 0) & (counts > 0))
        under = np.flatnonzero(D < 0)
        if over.size == 0 or under.size == 0:
            break
        j_max = over[np.argmax(D[over])]
        j_min = under[np.argmin(D[under])]
        move = min(steps, int(counts[j_max]))
        counts[j_max] -= move
        counts[j_min] += move
    return best, trace


@register_attack("rlu")
class RLU(LabelAttack):
    """RLU (Alg. 1 + Alg. 2). See the module docstring."""

    Config = RLUConfig

    def _recover(
        self,
        x: AttackInputs,
        aux: ImageSet | None,
        transform: Transform | None,
        device: torch.device,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if aux is None:  # pragma: no cover - LabelAttack.recover checks it
            raise ConfigError("rlu needs an auxiliary set")
        cfg: RLUConfig = self.config
        K, m = x.num_classes, x.train.steps
        dyn, drift = local_dynamics(x)
        rho = dyn.rho(m)
        h = dyn.history(drift, m)
        u = (x.db + h) / (x.train.lr * float(rho.sum()))

        def gaussians(which: str):
            q, _ = x.aux_outputs(which, aux, transform, bn_stats=cfg.bn_stats, device=device)
            return fit_gaussians(q.numpy(), aux.labels.numpy(), K, ridge=cfg.ridge)

        s_global = ConfidenceSampler(gaussians("global"), cfg.num_samples, cfg.seed)
        C = coefficient_matrix(s_global.S())
        g_local = None
        if m > 1:
            g_local = gaussians("local")
            s_local = ConfidenceSampler(g_local, cfg.num_samples, cfg.seed)
            C = 0.5 * (C + coefficient_matrix(s_local.S()))
        sol = simplex_lstsq(C, u)
        counts = largest_remainder(sol.z, x.total_labels)
        info: dict[str, Any] = {
            "z": sol.z.tolist(),
            "residual": sol.residual,
            "initial_counts": counts.tolist(),
        }
        if m > 1 and cfg.posterior_iters > 0 and g_local is not None:
            _, feats = x.aux_outputs("global", aux, transform, bn_stats=cfg.bn_stats, device=device)
            gain = trunk_gain(
                s_global.gauss.mean, g_local.mean, feats.numpy(), aux.labels.numpy(), x.dW, x.db
            )
            kappa = embedding_energy(x.dW, x.db) * gain
            info["kappa"], info["trunk_gain"] = kappa, gain
            counts, trace = posterior_search(
                counts,
                sampler=s_global,
                mu_local=g_local.mean,
                dyn=dyn,
                drift=drift,
                steps=m,
                kappa=kappa,
                iters=cfg.posterior_iters,
                criterion=cfg.posterior_criterion,
                observed_db=x.db,
            )
            info["posterior_mismatch"] = trace
        return counts, info
