"""FedPFT's upload and server sampling against Flower's FedPFT baseline.

Reference: github.com/adap/flower at commit
fdef7afb1dca3030553be302366cfd285ed6632c (``baselines/fedpft`` last changed in
7e1d22642fa084138fc293a3e1b7257881a61383), the authors' official code, under
the Apache License 2.0: ``fedpft/utils.py::learn_gmm`` (what a client sends
per class) and the sampling loop of ``fedpft/strategy.py::FedPFT.aggregate_fit``
(what the server draws from it), restated below with only their docstrings
and the Flower message conversion left out.

What a client sends, per class c it fits: the weights (k,), means (k, D) and
diagonal variances (k, D) of a ``GaussianMixture(covariance_type="diag")``,
each cast to float16, with n_c. osfl packs the same three arrays as the rows
[weight, mean, variance] of one float16 (k, 1 + 2D) tensor ``gmm.<c>`` and
n_c in ``meta.class_counts``; the test checks them bit for bit. The server
draws n_c features per (client, class) from the float32 copy of that mixture.

Deliberate differences, tested below: osfl seeds each (client, class) fit
from the run seed (Flower: one seed for every class), fits float64 features
(Flower's client hands over the extractor's float32 ones: the float16 rows
then agree to a float16 step), sends classes with n_c ≤ K under the default
``small_classes: fewer`` (Flower drops them; ``drop`` is Flower's rule), and
samples with torch's generator instead of numpy's (the same law, tested by
moments: the draws themselves differ), seeded per (client, class) where
Flower's server gives every mixture one ``random_state`` (two equal mixtures
would draw the same features there; docs/methods/fedpft.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from sklearn.mixture import GaussianMixture

from osfl.config import method_config
from osfl.fl.context import ClientContext
from osfl.fl.seeds import derive_seed
from osfl.methods.fedpft import FedPFT, sample_gmm_rows
from support.tiny import FAST_FEDPFT, seed_ctx

K = FAST_FEDPFT["components"]


# --- Flower's baseline, restated (Apache-2.0; see the module docstring) -------------
@dataclass
class GMMParameters:
    """GMM parameters (fedpft/utils.py)."""

    label: NDArray
    means: NDArray
    weights: NDArray
    covariances: NDArray
    num_samples: NDArray


def learn_gmm(
    features: NDArray,
    labels: NDArray,
    n_mixtures: int,
    cov_type: str,
    seed: int,
    tol: float = 1e-12,
    max_iter: int = 1000,
) -> list[GMMParameters]:
    """fedpft/utils.py::learn_gmm."""
    gmm_list = []
    for label in np.unique(labels):
        cond_features = features[label == labels]
        if len(cond_features) > n_mixtures:  # number of samples should be larger than `n_mixtures`.
            gmm = GaussianMixture(
                n_components=n_mixtures,
                covariance_type=cov_type,
                random_state=seed,
                tol=tol,
                max_iter=max_iter,
            )
            gmm.fit(cond_features)
            gmm_list.append(
                GMMParameters(
                    label=np.array(label),
                    means=gmm.means_.astype("float16"),
                    weights=gmm.weights_.astype("float16"),
                    covariances=gmm.covariances_.astype("float16"),
                    num_samples=np.array(len(cond_features)),
                )
            )
    return gmm_list


def flower_sample(gmm_parameter: GMMParameters, config: dict[str, Any]) -> tuple[Any, Any]:
    """The body of fedpft/strategy.py::FedPFT.aggregate_fit's sampling loop."""
    gmm = GaussianMixture(
        n_components=int(config["n_mixtures"]),
        covariance_type=config["cov_type"],
        random_state=int(config["seed"]),
        tol=float(config["tol"]),
        max_iter=int(config["max_iter"]),
    )
    # Set values of the GMMs
    gmm.means_ = gmm_parameter.means.astype("float32")
    gmm.weights_ = gmm_parameter.weights.astype("float32")
    gmm.covariances_ = gmm_parameter.covariances.astype("float32")

    # Sample features
    syn_features, _ = gmm.sample(gmm_parameter.num_samples)
    syn_features = torch.tensor(syn_features, dtype=torch.float32)
    gmm_labels = torch.tensor([int(gmm_parameter.label)] * int(gmm_parameter.num_samples))
    return syn_features, gmm_labels


# --- the comparisons -----------------------------------------------------------------
def client_features(tiny: Any, small_classes: str, client: int = 0) -> tuple[Any, ...]:
    """(method, context, upload, the float64 features osfl fitted, labels)."""
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, {**FAST_FEDPFT, "small_classes": small_classes}), ctx.run)
    data = ctx.splits.train.subset(ctx.federation.client_indices[client].copy())
    cctx = ClientContext(ctx.run, client, 0, torch.Generator())
    broadcast = m.broadcast(m.init_state(), 0)
    up = m.client_update(cctx, broadcast, data)
    feats = m.client_tokens(cctx, data, m.check_broadcast(cctx, broadcast))[:, 0]
    return m, ctx, up, feats.double().numpy(), data.labels.numpy()


@pytest.fixture(scope="module")
def clients(tiny) -> Any:
    """``clients(small_classes, client=0)``: :func:`client_features`, computed once."""
    cache: dict[tuple[str, int], tuple[Any, ...]] = {}

    def get(small_classes: str, client: int = 0) -> tuple[Any, ...]:
        if (small_classes, client) not in cache:
            cache[small_classes, client] = client_features(tiny, small_classes, client)
        return cache[small_classes, client]

    return get


def seed_of(ctx: Any, client: int, c: int) -> int:
    return derive_seed(ctx.run.seed, "fedpft-gmm", client, c) % 2**32


def as_rows(p: GMMParameters) -> torch.Tensor:
    w, m, v = (torch.from_numpy(a) for a in (p.weights, p.means, p.covariances))
    return torch.cat([w[:, None], m, v], dim=1)


def test_the_upload_is_flowers_learn_gmm_bit_for_bit(clients) -> None:
    """``small_classes: drop``: the classes sent, their float16 weights, means
    and variances, and n_c are those of learn_gmm (diag, K components, the
    same EM settings) given the same features and each class's seed."""
    _, ctx, up, f, y = clients("drop")
    sent = sorted(int(k.split(".")[1]) for k in up.tensors)
    counts = np.bincount(y, minlength=10)
    assert sent == sorted(np.flatnonzero(counts > K).tolist()) and sent  # Flower's n_c > K
    for c in sent:
        cfg = (K, "diag", seed_of(ctx, 0, c), FAST_FEDPFT["tol"], FAST_FEDPFT["max_iter"])
        (theirs,) = learn_gmm(f[y == c], y[y == c], *cfg)
        ours = up.tensors[f"gmm.{c}"]
        assert ours.dtype == torch.float16 and ours.shape == (K, 1 + 2 * f.shape[1])
        assert torch.equal(ours, as_rows(theirs)), c
        assert up.meta["class_counts"][c] == int(theirs.num_samples)


def test_float32_features_give_the_same_rows_to_a_float16_step(clients) -> None:
    """Deliberate difference: osfl fits float64 features, Flower's client the
    extractor's float32 ones; sklearn then runs EM in float32, and the rows
    agree to float16 resolution."""
    _, ctx, up, f, y = clients("drop")
    for key, ours in up.tensors.items():
        c = int(key.split(".")[1])
        cfg = (K, "diag", seed_of(ctx, 0, c), FAST_FEDPFT["tol"], FAST_FEDPFT["max_iter"])
        (theirs,) = learn_gmm(f[y == c].astype("float32"), y[y == c], *cfg)
        rows = as_rows(theirs).float()
        step = 2.0**-10 * rows.abs().clamp(min=2.0**-14)  # one float16 step
        assert bool(((ours.float() - rows).abs() <= 2 * step + 1e-4).all()), c


def test_fewer_keeps_flowers_rows_and_adds_the_small_classes(clients) -> None:
    """Deliberate difference: the default ``fewer`` sends the same rows for
    classes with n_c > K and min(K, n_c) components for the classes Flower
    drops."""
    _, _, drop, _, _ = clients("drop")
    _, _, fewer, _, y = clients("fewer")
    counts = np.bincount(y, minlength=10)
    assert set(fewer.tensors) == {f"gmm.{c}" for c in np.flatnonzero(counts)}
    assert set(drop.tensors) < set(fewer.tensors)
    for key, rows in drop.tensors.items():
        assert torch.equal(fewer.tensors[key], rows)
    for c in np.flatnonzero((counts > 0) & (counts <= K)):
        assert len(fewer.tensors[f"gmm.{c}"]) == min(K, counts[c])


def mixture() -> GMMParameters:
    """A float16 3-component diagonal mixture in 2 dimensions, as a client sends."""
    return GMMParameters(
        label=np.array(4),
        weights=np.array([0.2, 0.5, 0.3]).astype("float16"),
        means=np.array([[-6.0, 1.0], [0.5, -2.0], [6.0, 3.0]]).astype("float16"),
        covariances=np.array([[0.3, 1.0], [0.5, 0.1], [0.4, 2.0]]).astype("float16"),
        num_samples=np.array(20000),
    )


def law(p: GMMParameters) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the mixture (float32 parameters, as both read it)."""
    w = p.weights.astype("float32").astype("float64")
    mu = p.means.astype("float32").astype("float64")
    var = p.covariances.astype("float32").astype("float64")
    mean = w @ mu
    second = sum(
        wk * (np.diag(vk) + np.outer(mk, mk)) for wk, mk, vk in zip(w, mu, var, strict=True)
    )
    return mean, second - np.outer(mean, mean)


@pytest.mark.parametrize("seed", [0, 1])
def test_server_draws_follow_the_uploaded_mixture_as_flowers_do(seed: int) -> None:
    """sample_gmm_rows (torch) and Flower's gmm.sample (numpy) on the same
    float16 mixture: the same law — mean, covariance and component shares
    within sampling error of the mixture's own, and of each other."""
    p = mixture()
    cfg = {"n_mixtures": 3, "cov_type": "diag", "seed": seed, "tol": 1e-12, "max_iter": 10}
    theirs, labels = flower_sample(p, cfg)
    assert labels.tolist() == [4] * 20000
    ours = sample_gmm_rows(as_rows(p), 20000, torch.Generator().manual_seed(seed), 1e-6)
    assert ours.shape == theirs.shape == (20000, 2) and ours.dtype == theirs.dtype
    mean, cov = law(p)
    se = np.sqrt(np.diag(cov) / 20000)
    for x in (ours.double().numpy(), theirs.double().numpy()):
        assert (np.abs(x.mean(0) - mean) < 5 * se).all()
        np.testing.assert_allclose(np.cov(x, rowvar=False), cov, atol=0.05 * cov.max())
    # component shares, read off the first coordinate's well separated modes
    for x in (ours[:, 0].numpy(), theirs[:, 0].numpy()):
        shares = [(x < -3).mean(), ((x > -3) & (x < 3)).mean(), (x > 3).mean()]
        np.testing.assert_allclose(shares, [0.2, 0.5, 0.3], atol=0.015)


def test_the_server_draws_n_c_per_client_and_class(clients) -> None:
    """As Flower's strategy: every (client, class) mixture sent gives n_c
    features labelled c (``num_samples`` of its GMMParameters)."""
    m = clients("drop")[0]
    uploads = {}
    for client in range(3):
        _, _, uploads[client], _, _ = clients("drop", client)
    x, y = m.synthetic_features(uploads)
    expect = np.zeros(10, dtype=int)
    for up in uploads.values():
        for key in up.tensors:
            c = int(key.split(".")[1])
            expect[c] += up.meta["class_counts"][c]
    assert np.bincount(y.numpy(), minlength=10).tolist() == expect.tolist()
    assert x.shape == (int(expect.sum()), m.token_dim()) and x.dtype == torch.float32
