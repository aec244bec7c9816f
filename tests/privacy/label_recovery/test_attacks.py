"""Label-recovery attacks: the simplex solver, RLU's pieces (Table 1, S, C),
RLU end to end on an untrained model, each baseline on a case where its
formula is exact, and refusal of bad Observations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from osfl.errors import ConfigError, OsflError
from osfl.fl.observation import Observation
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import ATTACKS, ObservationError, run_attack
from osfl.privacy.label_recovery.coefficients import LocalDynamics, rho_numeric
from osfl.privacy.label_recovery.idlg import idlg_label
from osfl.privacy.label_recovery.irlg import irlg_counts
from osfl.privacy.label_recovery.llg import llg_counts
from osfl.privacy.label_recovery.moments import (
    ConfidenceSampler,
    LogitGaussians,
    coefficient_matrix,
    fit_gaussians,
)
from osfl.privacy.label_recovery.simplex_lsq import (
    largest_remainder,
    project_simplex,
    simplex_lstsq,
)
from osfl.privacy.label_recovery.zlg import zlg_counts
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def digits(digits_with_aux):
    return digits_with_aux


def _model(act: str = "relu", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("lenet5", num_classes=K, img_size=16, act=act)


def _observe(train, *, n=120, steps=1, batch=16, act="relu", seed=1, **cfg):
    client = train.subset(np.random.default_rng(seed).choice(len(train), n, replace=False))
    tc = TrainConfig(steps=steps, batch_size=batch, lr=0.01, drop_last=True, **cfg)
    spec = model_hparams("lenet5", {"img_size": 16, "act": act}, K)
    obs, _ = simulate_observation(_model(act), client, tc, model_spec=spec, seed=seed)
    return obs


# ------------------------------------------------------------------ simplex least squares
@pytest.mark.parametrize("seed", range(5))
def test_simplex_lstsq_satisfies_constraints_and_kkt(seed):
    rng = np.random.default_rng(seed)
    n = 8
    A = rng.normal(size=(12, n))
    u = rng.normal(size=12) * 3
    sol = simplex_lstsq(A, u)
    z = sol.z
    assert (z >= 0).all()  # exactly, not up to a tolerance
    assert abs(z.sum() - 1.0) < 1e-12
    # KKT of min ½||Az-u||² on the simplex: grad_i = λ where z_i > 0, grad_i >= λ where z_i = 0
    g = A.T @ (A @ z - u)
    active = z > 1e-9
    lam = g[active].mean()
    assert np.allclose(g[active], lam, atol=1e-6 * max(1.0, abs(lam)))
    assert (g[~active] >= lam - 1e-6 * max(1.0, abs(lam))).all()
    # no random feasible point does better
    for _ in range(200):
        w = rng.dirichlet(np.ones(n))
        assert np.linalg.norm(A @ w - u) >= sol.residual - 1e-9


def test_simplex_lstsq_recovers_interior_solution_exactly():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(10, 10))
    z_true = rng.dirichlet(np.ones(10))
    sol = simplex_lstsq(A, A @ z_true)
    np.testing.assert_allclose(sol.z, z_true, atol=1e-8)
    assert sol.residual < 1e-7


def test_simplex_lstsq_refuses_bad_input():
    with pytest.raises(ConfigError, match="rows"):
        simplex_lstsq(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ConfigError, match="finite"):
        simplex_lstsq(np.array([[np.nan, 1.0]]), np.ones(1))


def test_project_simplex_known_values():
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex(np.array([2.0, 0.0, 0.0])), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([1.0, 1.0, -5.0])), [0.5, 0.5, 0.0])


def test_largest_remainder():
    # 7 * [.5, .3, .2] = [3.5, 2.1, 1.4] -> floors [3, 2, 1], one left -> largest remainder .5
    assert largest_remainder(np.array([0.5, 0.3, 0.2]), 7).tolist() == [4, 2, 1]
    # ties go to the lower index
    assert largest_remainder(np.array([0.25, 0.25, 0.25, 0.25]), 6).tolist() == [2, 2, 1, 1]
    c = largest_remainder(np.random.default_rng(0).dirichlet(np.ones(10)), 640)
    assert c.sum() == 640 and (c >= 0).all()
    with pytest.raises(ConfigError):
        largest_remainder(np.ones(3), -1)


# ------------------------------------------------------------------ RLU's pieces
def test_coefficient_matrix_matches_eq9():
    rng = np.random.default_rng(0)
    S = rng.dirichlet(np.ones(4), size=4)  # S[n, :] a softmax mean
    C = coefficient_matrix(S)
    N = np.array([3, 0, 5, 2])
    # Eq. 9: Δb_j/η·|B| = N_j Σ_{n≠j} S_{j,n} − Σ_{n≠j} N_n S_{n,j}
    expect = [
        N[j] * sum(S[j, n] for n in range(4) if n != j)
        - sum(N[n] * S[n, j] for n in range(4) if n != j)
        for j in range(4)
    ]
    np.testing.assert_allclose(C @ N, expect)
    np.testing.assert_allclose(C.sum(axis=0), 0.0, atol=1e-12)


def test_monte_carlo_confidence_of_a_point_mass():
    # zero covariance: S[n] is exactly softmax(mu_n)
    mu = np.array([[1.0, 0.0, -1.0], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    g = LogitGaussians(mu, np.zeros((3, 3, 3)), np.ones(3))
    S = ConfidenceSampler(g, 10).S()
    p = np.exp(mu) / np.exp(mu).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(S, p, atol=1e-12)


def test_fit_gaussians_needs_every_class():
    with pytest.raises(OsflError, match="class"):
        fit_gaussians(np.zeros((4, 3)), np.array([0, 0, 1, 1]), 3)


@pytest.mark.parametrize(
    "dyn",
    [
        LocalDynamics(lr=0.05),
        LocalDynamics(lr=0.05, momentum=0.9),
        LocalDynamics(lr=0.05, momentum=0.5, nesterov=True),
        LocalDynamics(lr=0.05, prox=2.0),
    ],
    ids=["sgd", "sgdm", "nag", "prox"],
)
def test_table1_rho_matches_torch_sgd(dyn):
    m = 6
    rho = dyn.rho(m)
    np.testing.assert_allclose(rho, rho_numeric(m, dyn), rtol=1e-12)
    # torch.optim.SGD on one scalar with the prox term: Δb = −η Σ ρ(τ) g_τ
    g = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.2, 1.5], dtype=torch.float64)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([b], lr=dyn.lr, momentum=dyn.momentum, nesterov=dyn.nesterov)
    for k in range(m):
        opt.zero_grad()
        (b * g[k] + 0.5 * dyn.prox * b.pow(2)).sum().backward()
        opt.step()
    assert float(b.detach()) == pytest.approx(-dyn.lr * float(rho @ g.numpy()), rel=1e-10)


def test_table1_history_terms():
    lam, eta, m = 0.5, 0.05, 10
    dyn = LocalDynamics(lr=eta, prox=lam)
    past = np.array([0.1, -0.2, 0.3])
    # FedDyn (Eq. 80): h = (1 − (1 − λη)^m) Σ_{r<t} Δb^(r), from the offset d = λ Σ Δb^(r)
    np.testing.assert_allclose(dyn.history(lam * past, m), (1 - (1 - lam * eta) ** m) * past)
    # SCAFFOLD (Eq. 63): h = η m (c − c_i)
    c_diff = np.array([0.01, 0.0, -0.02])
    np.testing.assert_allclose(LocalDynamics(lr=eta).history(c_diff, m), eta * m * c_diff)


# ------------------------------------------------------------------ RLU end to end
@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_rlu_recovers_exact_counts_on_untrained_model(digits, act):
    train, aux = digits
    obs = _observe(train, act=act)
    res = run_attack("rlu", obs, aux)
    truth = np.bincount(obs.truth["labels"].numpy(), minlength=K)
    assert res.counts.tolist() == truth.tolist()
    assert res.score(obs.truth["labels"]) == {"cAcc": 1.0, "iAcc": 1.0}


def test_rlu_multiple_steps_posterior_search(digits):
    train, aux = digits
    obs = _observe(train, steps=5, batch=16, n=160)
    res = run_attack("rlu", obs, aux, num_samples=1024)
    assert res.counts.sum() == 5 * 16 == len(obs.truth["labels"])
    trace = res.info["posterior_mismatch"]
    assert len(trace) >= 1 and all(np.isfinite(trace))
    assert res.score(obs.truth["labels"])["iAcc"] >= 0.8  # chance is ~0.3


def test_rlu_runs_on_fedprox_and_momentum(digits):
    train, aux = digits
    for cfg in ({"optimizer": "sgdm", "momentum": 0.9}, {"optimizer": "nesterov", "momentum": 0.5}):
        obs = _observe(train, steps=3, **cfg)
        assert run_attack("rlu", obs, aux, num_samples=512).counts.sum() == 48
    obs = _observe(train, steps=3)
    obs.hparams["fl"] = {"scheme": "fedprox", "mu": 0.5}
    assert run_attack("rlu", obs, aux, num_samples=512).score(obs.truth["labels"])["iAcc"] > 0.8


def test_attacks_after_save_and_load(digits, tmp_path):
    train, aux = digits
    obs = _observe(train)
    again = Observation.load(obs.save(tmp_path / "obs"))
    for name in ("rlu", "llg+", "zlg+", "irlg"):
        a = run_attack(name, obs, aux, **({"num_samples": 256} if name == "rlu" else {}))
        b = run_attack(name, again, aux, **({"num_samples": 256} if name == "rlu" else {}))
        assert a.counts.tolist() == b.counts.tolist()
        assert a.counts.sum() == 16


# ------------------------------------------------------------------ baselines: exact cases
def test_llg_counts_exact_on_its_own_model():
    N = np.array([3, 0, 2, 1, 0])
    total, impact, offset = 6, -1.0, np.array([0.1, 0.2, 0.05, 0.1, 0.15])
    g = N * impact + (total - N) * offset  # LLG's linear model, exact
    assert llg_counts(g, impact, offset, total).tolist() == N.tolist()


def test_zlg_counts_exact_on_its_own_model():
    N = np.array([4, 0, 1, 3])
    p_mean, o_mean = np.array([0.3, 0.2, 0.25, 0.25]), 2.5
    g = o_mean * (N.sum() * p_mean - N)  # g_j = Ō (total p̄_j − N_j)
    assert zlg_counts(g, p_mean, o_mean, int(N.sum())).tolist() == N.tolist()


def test_irlg_counts_exact_with_shared_embedding():
    rng = np.random.default_rng(0)
    Kc, L = 5, 7
    W, b = rng.normal(size=(Kc, L)) * 0.3, rng.normal(size=Kc) * 0.1
    e = np.abs(rng.normal(size=L))  # the untrained-model regime: one embedding for all samples
    p = np.exp(W @ e + b)
    p /= p.sum()
    N = np.array([2, 0, 5, 1, 0])
    G_b = sum(N[c] * (p - np.eye(Kc)[c]) for c in range(Kc))
    G_W = np.outer(G_b, e)
    counts, raw = irlg_counts(G_W, G_b, W, b, int(N.sum()))
    assert counts.tolist() == N.tolist()
    np.testing.assert_allclose(raw, N, atol=1e-6)


def test_idlg_single_sample(digits):
    train, _ = digits
    for seed in range(3):
        obs = _observe(train, batch=1, seed=seed + 10)
        y = int(obs.truth["labels"][0])
        res = run_attack("idlg", obs)  # no auxiliary set needed
        assert res.counts.tolist() == np.eye(K, dtype=int)[y].tolist()
        assert run_attack("idlg", obs, source="bias").counts[y] == 1
    # the formula itself: only the true row of (p − 1_y) e^T is negative when e > 0
    p, e = np.full(4, 0.25), np.array([0.5, 1.0, 2.0])
    G_W = np.outer(p - np.eye(4)[2], e)
    assert idlg_label(G_W, p - np.eye(4)[2]) == 2


# ------------------------------------------------------------------ contract and refusals
def test_registry_and_options(digits):
    assert {"rlu", "llg+", "zlg+", "irlg", "idlg"} <= set(ATTACKS.names())
    train, aux = digits
    obs = _observe(train)
    with pytest.raises(ConfigError, match="unknown attack"):
        run_attack("nope", obs, aux)
    with pytest.raises(ConfigError, match="num_samples"):
        run_attack("rlu", obs, aux, bogus=1)
    with pytest.raises(ConfigError, match="auxiliary"):
        run_attack("rlu", obs)
    with pytest.raises(ConfigError, match="single sample"):
        run_attack("idlg", obs)


def _replace(obs: Observation, **kw) -> Observation:
    return dataclasses.replace(obs, **kw)


def test_bad_observations_are_refused_with_the_field(digits):
    train, aux = digits
    obs = _observe(train)
    up = dict(obs.upload)
    del up["fc3.bias"]
    with pytest.raises(ObservationError, match=r"upload\[fc3.bias\]"):
        run_attack("rlu", _replace(obs, upload=up), aux)
    up = dict(obs.upload)
    up["fc3.weight"] = torch.zeros(3, 84)
    with pytest.raises(ObservationError, match=r"upload\[fc3.weight\].*shape \(3, 84\)"):
        run_attack("llg+", _replace(obs, upload=up), aux)
    bc = dict(obs.broadcast)
    bc["fc3.bias"] = torch.full((K,), float("nan"))
    with pytest.raises(ObservationError, match="NaN"):
        run_attack("irlg", _replace(obs, broadcast=bc))
    hp = {**obs.hparams, "train": {**obs.hparams["train"], "lr": 0}}
    with pytest.raises(ObservationError, match=r"hparams\.train\.lr"):
        run_attack("rlu", _replace(obs, hparams=hp), aux)
    hp = {k: v for k, v in obs.hparams.items() if k != "model"}
    with pytest.raises(ObservationError, match=r"hparams\.model"):
        run_attack("rlu", _replace(obs, hparams=hp), aux)
    # ... but an explicit model= works
    assert run_attack("irlg", _replace(obs, hparams=hp), model=_model()).counts.sum() == 16
    hp = {**obs.hparams, "fl": {"scheme": "scaffold"}}
    with pytest.raises(ObservationError, match=r"history\.scaffold\.c"):
        run_attack("rlu", _replace(obs, hparams=hp, round=3), aux)
    hp = {**obs.hparams, "fl": {"scheme": "fedunknown"}}
    with pytest.raises(ConfigError, match="fedavg"):
        run_attack("rlu", _replace(obs, hparams=hp), aux)


# ------------------------------------------------------------------ recorded runs (part A's plumbing)
@pytest.mark.parametrize(("method", "options"), [("scaffold", {}), ("feddyn", {"alpha": 0.1})])
def test_rlu_on_observations_recorded_by_a_scheme_run(digits, method, options):
    """A 2-round run of a stateful scheme recorded by the audit recorder: RLU reads
    the scheme's history (h term) in round 1 and recovers the labels."""
    import osfl.methods  # noqa: F401  (registers the schemes)
    from osfl.data.partition import make_federation
    from osfl.fl.context import ModelSpec, RunContext
    from osfl.fl.method import METHODS
    from osfl.fl.runtime.simulation import run_simulation
    from osfl.privacy.audit import AuditRecorder

    train, aux = digits
    sub = train.subset(np.arange(300))
    fed = make_federation(sub.labels, "dirichlet", 3, 0, alpha=1.0)
    run = RunContext(
        num_classes=K,
        image_shape=sub.image_shape,
        num_clients=3,
        model=ModelSpec("lenet5", {"img_size": 16}),
        train=TrainConfig(steps=3, batch_size=16, lr=0.05, drop_last=True, amp=False),
        train_transform=None,
        eval_transform=None,
    )
    cls = METHODS.get(method)
    m = cls(cls.Config(rounds=2, **options), run)
    rec = AuditRecorder(m, run, rounds=[1])
    run_simulation(m, run, sub, fed, observers=[rec])
    assert len(rec.observations) == 3
    for obs in rec.observations:
        assert obs.history and all(k.startswith(f"history.{method}.") for k in obs.history)
        assert not any(k.startswith("history.") for k in obs.upload)
        res = run_attack("rlu", obs, aux, num_samples=1024)
        assert res.counts.sum() == 48
        assert res.score(obs.truth["labels"])["iAcc"] >= 0.7
    # without the history the h term is unknown: refused, naming the tensor
    obs = rec.observations[0]
    with pytest.raises(ObservationError, match=r"history\."):
        run_attack("rlu", _replace(obs, history={}), aux)


# ------------------------------------------------------------------ posterior search pieces
def test_trunk_gain_recovers_a_known_ratio():
    from osfl.privacy.label_recovery.rlu import trunk_gain

    rng = np.random.default_rng(0)
    feats, labels = rng.normal(size=(30, 4)), np.repeat(np.arange(3), 10)
    dW, db = rng.normal(size=(3, 4)) * 0.01, rng.normal(size=3) * 0.01
    explained = np.stack([(feats[labels == n] @ dW.T + db).mean(0) for n in range(3)])
    mu0 = rng.normal(size=(3, 3))
    # observed = 2.5 x explained + a common shift per class (softmax-invariant)
    mu1 = mu0 + 2.5 * explained + rng.normal(size=(3, 1))
    assert trunk_gain(mu0, mu1, feats, labels, dW, db) == pytest.approx(2.5)
    assert trunk_gain(mu0, mu0 - explained, feats, labels, dW, db) == 1.0  # not positive: 1


def test_posterior_search_bias_criterion_walks_back_to_the_truth():
    from osfl.privacy.label_recovery.rlu import posterior_search

    K, m, total = 4, 5, 100
    gauss = LogitGaussians(np.zeros((K, K)), np.zeros((K, K, K)), np.ones(K))
    sampler = ConfidenceSampler(gauss, 4)
    dyn = LocalDynamics(lr=0.5)
    truth = np.array([40, 30, 20, 10])
    # the observed bias update of the very dynamics the search simulates
    z, delta, G = truth / total, np.zeros(K), []
    for _ in range(m):
        G.append(dyn.lr * coefficient_matrix(sampler.S(3.0 * delta[None, :])) @ z)
        delta = np.sum(G, axis=0)
    start = truth + np.array([-5, 0, 5, 0])  # m labels moved from class 0 to class 2
    found, trace = posterior_search(start, sampler=sampler, mu_local=np.zeros((K, K)), dyn=dyn,
                                    drift=None, steps=m, kappa=3.0, iters=3, criterion="bias",
                                    observed_db=delta)  # fmt: skip
    assert found.tolist() == truth.tolist()
    assert trace[1] < trace[0] and trace[1] == pytest.approx(0.0, abs=1e-12)
