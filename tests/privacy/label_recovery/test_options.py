"""The label attacks' options, diagnostics and edge cases, exactly: the
clients' transform reaches the auxiliary forward, each attack reports the
diagnostics docs/privacy.md names, bad options are refused with their exact
message, and the counting rules at their boundaries (a zero gradient row sum,
ties among many classes, a zero mean embedding, RLU's logit-shift factor and
trunk gain at zero and below one).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osfl.errors import ConfigError
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import ATTACKS, run_attack
from osfl.privacy.label_recovery.coefficients import LocalDynamics
from osfl.privacy.label_recovery.llg import llg_counts
from osfl.privacy.label_recovery.moments import ConfidenceSampler, LogitGaussians
from osfl.privacy.label_recovery.rlu import embedding_energy, posterior_search, trunk_gain
from osfl.privacy.label_recovery.zlg import zlg_counts, zlg_estimate
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10


def inverted(x: torch.Tensor) -> torch.Tensor:
    """A transform other than the default ``x/255``."""
    return 1.0 - x.float() / 255.0


@pytest.fixture(scope="module")
def observed(digits_with_aux):
    train, aux = digits_with_aux
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=K, img_size=16)
    tc = TrainConfig(steps=2, batch_size=8, lr=0.05, drop_last=True)
    obs, local = simulate_observation(
        model, train.subset(range(16)), tc, model_spec=model_hparams("lenet5", {"img_size": 16}, K)
    )
    return obs, aux, model, local


def _features(model, aux, transform):
    model.eval()
    with torch.no_grad():
        e = model.features(transform(aux.images)).double()
        return torch.softmax(model.fc3(e.float()).double(), dim=1).numpy(), e.numpy()


# ------------------------------------------------------------------ the transform
def test_the_transform_reaches_the_auxiliary_forward(observed):
    obs, aux, model, local = observed
    p, e = _features(model, aux, inverted)
    y = aux.labels.numpy()
    zlg = run_attack("zlg+", obs, aux, transform=inverted).info
    np.testing.assert_allclose(zlg["o_mean"], e.sum(axis=1).mean(), rtol=1e-6)
    np.testing.assert_allclose(zlg["p_mean"], p.mean(axis=0), rtol=1e-5)
    llg = run_attack("llg+", obs, aux, transform=inverted).info
    impact = np.mean((p[np.arange(len(y)), y] - 1.0) * e.sum(axis=1))
    np.testing.assert_allclose(llg["impact"], impact, rtol=1e-5)
    fed = run_attack("zlg+fedavg", obs, aux, transform=inverted).info
    _, e1 = _features(local, aux, inverted)
    np.testing.assert_allclose(
        [fed["o_start"], fed["o_end"]], [e.sum(1).mean(), e1.sum(1).mean()], rtol=1e-6
    )
    plain = run_attack("rlu", obs, aux, num_samples=256).info["z"]
    assert run_attack("rlu", obs, aux, num_samples=256, transform=inverted).info["z"] != plain


# ------------------------------------------------------------------ diagnostics
@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("llg+", {"impact", "offset"}),
        ("zlg+", {"p_mean", "o_mean"}),
        ("zlg+fedavg", {"interpolate", "o_start", "o_end", "raw"}),
        ("irlg", {"raw"}),
        ("rlu", {"z", "residual", "initial_counts", "kappa", "trunk_gain", "posterior_mismatch"}),
    ],
)
def test_each_attack_reports_its_diagnostics(observed, name, keys):
    obs, aux, _, _ = observed
    info = run_attack(name, obs, aux).info
    assert set(info) == keys
    if name == "zlg+fedavg":
        assert info["interpolate"] == "steps"
        assert run_attack(name, obs, aux, interpolate="end").info["interpolate"] == "end"
    if name == "rlu":
        assert sum(info["initial_counts"]) == 16 and len(info["z"]) == K
        assert set(run_attack(name, obs, aux, posterior_iters=0).info) == {
            "z",
            "residual",
            "initial_counts",
        }


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("llg+", {"bn_stats": "train"}, "bn_stats must be 'batch' or 'running', got 'train'"),
        ("zlg+", {"bn_stats": "x"}, "bn_stats must be 'batch' or 'running', got 'x'"),
        ("idlg", {"source": "grad"}, "idlg: source must be 'weight' or 'bias', got 'grad'"),
        ("rlu", {"num_samples": 0}, "rlu: num_samples must be >= 1, got 0"),
        ("rlu", {"posterior_iters": -1}, "rlu: posterior_iters must be >= 0, got -1"),
        (
            "rlu",
            {"posterior_criterion": "mean"},
            "rlu: posterior_criterion must be 'logits' or 'bias', got 'mean'",
        ),
        ("rlu", {"bn_stats": "eval"}, "rlu: bn_stats must be 'batch' or 'running', got 'eval'"),
    ],
)
def test_bad_options_are_refused(name, options, message):
    with pytest.raises(ConfigError) as e:
        ATTACKS.get(name).Config(**options)
    assert str(e.value) == message


def test_idlg_refuses_a_batch(observed):
    obs, _, _, _ = observed
    with pytest.raises(ConfigError) as e:
        run_attack("idlg", obs)
    assert str(e.value) == (
        "idlg recovers the label of a single sample; this observation used 16 labels (2 steps of "
        "batch 8); use rlu, llg+, zlg+ or irlg for batches"
    )


# ------------------------------------------------------------------ counting at the boundaries
def test_llg_counts_are_integers_and_a_zero_row_sum_is_not_negative():
    """``g_j = 0`` is not a negative class: with one label, class 0 (the only
    negative) gets it although class 1's residual is lower."""
    got = llg_counts(np.array([-1.0, 0.0, 0.5]), -1.0, np.array([0.0, 2.0, 0.0]), 1)
    assert got.dtype == np.int64 and got.tolist() == [1, 0, 0]


def test_llg_ties_among_many_negative_classes_go_to_the_lower_index():
    """300 negative classes, two residual levels, 50 labels: the 50 lowest-index
    classes of the lower level (0, 2, 4, ...), as a stable sort gives (numpy's
    default sort picks another 50 of the 150 tied classes here)."""
    g = np.full(300, -1.0)
    g[::2] = -2.0
    got = llg_counts(g, -1.0, np.zeros(300), 50)
    assert np.flatnonzero(got).tolist() == list(range(0, 100, 2))


def test_llg_offset_is_the_mean_over_the_other_classes_however_few(observed):
    """Two auxiliary images (classes a, b): the offset of class a is the value of
    the one image not of class a, ``p_a · Σe`` of image b."""
    obs, aux, model, _ = observed
    y = aux.labels.numpy()
    two = aux.subset([int(np.flatnonzero(y == 3)[0]), int(np.flatnonzero(y == 5)[0])])
    p, e = _features(model, two, lambda x: x.float() / 255.0)
    offset = run_attack("llg+", obs, two).info["offset"]
    np.testing.assert_allclose(offset[3], p[1, 3] * e[1].sum(), rtol=1e-5)
    np.testing.assert_allclose(offset[5], p[0, 5] * e[0].sum(), rtol=1e-5)
    np.testing.assert_allclose(offset[0], (p[:, 0] * e.sum(axis=1)).mean(), rtol=1e-5)


def test_zlg_with_a_zero_mean_embedding_divides_by_1e_12():
    g, p = np.array([1e-12, -2e-12]), np.array([0.5, 0.5])
    np.testing.assert_allclose(zlg_estimate(g, p, 0.0, 4), [1.0, 4.0], rtol=1e-12)
    assert zlg_counts(g, p, 0.0, 5).tolist() == [1, 4]


def test_embedding_energy_by_hand():
    """``ē = Σ_j Δb_j ΔW_j / Σ_j Δb_j²``; energy ``||ē||² + 1``; 1 when Δb = 0."""
    dW = np.array([[0.02, -0.01], [0.0, 0.03]])
    db = np.array([0.01, -0.02])
    e = (0.01 * dW[0] - 0.02 * dW[1]) / (0.01**2 + 0.02**2)
    assert embedding_energy(dW, db) == pytest.approx(float(e @ e) + 1.0, rel=1e-12)
    assert embedding_energy(dW, np.zeros(2)) == 1.0


def test_trunk_gain_edges():
    """A ratio below one is kept; an update that explains nothing (Δ = 0) or
    logits that did not move give 1."""
    rng = np.random.default_rng(1)
    feats, labels = rng.normal(size=(30, 4)), np.repeat(np.arange(3), 10)
    dW, db = rng.normal(size=(3, 4)) * 0.01, rng.normal(size=3) * 0.01
    explained = np.stack([(feats[labels == n] @ dW.T + db).mean(0) for n in range(3)])
    mu0 = rng.normal(size=(3, 3))
    assert trunk_gain(mu0, mu0 + 0.5 * explained, feats, labels, dW, db) == pytest.approx(0.5)
    assert trunk_gain(mu0, mu0, feats, labels, dW, db) == 1.0
    assert trunk_gain(mu0, mu0 + explained, feats, labels, np.zeros((3, 4)), np.zeros(3)) == 1.0


def test_posterior_search_compares_logits_by_default():
    """Alg. 2 as written (``criterion="logits"``) is the function's default; an
    unknown criterion, or "bias" without the observed update, is refused."""
    gauss = LogitGaussians(np.zeros((3, 3)), np.zeros((3, 3, 3)), np.ones(3))
    kw = {
        "sampler": ConfidenceSampler(gauss, 4),
        "dyn": LocalDynamics(lr=0.5),
        "drift": None,
        "steps": 2,
    }
    counts = np.array([4, 2, 2])
    found, trace = posterior_search(counts, mu_local=np.zeros((3, 3)), kappa=1.0, iters=2, **kw)
    same, again = posterior_search(
        counts, mu_local=np.zeros((3, 3)), kappa=1.0, iters=2, criterion="logits", **kw
    )
    assert found.tolist() == same.tolist() and trace == again
    with pytest.raises(ConfigError) as e:
        posterior_search(
            counts, mu_local=np.zeros((3, 3)), kappa=1.0, iters=1, criterion="mean", **kw
        )
    assert str(e.value) == "posterior criterion must be 'logits' or 'bias', got 'mean'"
    with pytest.raises(ConfigError) as e:
        posterior_search(
            counts, mu_local=np.zeros((3, 3)), kappa=1.0, iters=1, criterion="bias", **kw
        )
    assert str(e.value) == "the 'bias' posterior criterion needs the observed bias update"
