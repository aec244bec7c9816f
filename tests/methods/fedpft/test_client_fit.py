"""FedPFT's client fit and server draw by value: the pooled variance over
classes of different sizes, EM's stopping options reaching scikit-learn,
its one warning and its log line, a single sample's component, the draw
``mean + eps·σ``, and the option checks at their bounds (the mutants of
``osfl.methods.fedpft``; TESTING.md, "Mutation testing")."""

from __future__ import annotations

import logging
import threading
import warnings

import numpy as np
import pytest
import sklearn.mixture
import torch

from osfl.config import method_config
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.tensor_fit import FitConfig
from osfl.fl.upload import Broadcast, Upload
from osfl.methods.fedpft import FedPFT, FedPFTConfig, fit_class_gmm, pooled_variance
from osfl.methods.fedpft import sample_gmm_rows as draw
from support.tiny import FAST_FEDPFT, seed_ctx


def test_the_pooled_variance_sums_squares_and_degrees_of_freedom_over_classes() -> None:
    """Three classes of 3, 1 and 2 samples, in mixed order: the singleton
    adds nothing; the others' squared deviations from their own means over
    (3 − 1) + (2 − 1) degrees of freedom."""
    f = np.array([[0.0, 1.0], [5.0, 5.0], [3.0, 0.0], [9.0, 9.0], [6.0, 2.0], [1.0, 2.0]])
    labels = np.array([0, 2, 0, 1, 2, 0])
    ss0 = ((f[[0, 2, 5]] - f[[0, 2, 5]].mean(0)) ** 2).sum(0)  # [4.6667, 2.0]
    ss2 = ((f[[1, 4]] - f[[1, 4]].mean(0)) ** 2).sum(0)  # [0.5, 4.5]
    assert np.allclose(pooled_variance(f, labels, 1e-6), (ss0 + ss2) / 3)
    assert np.allclose(pooled_variance(f, labels, 1e-6), [(14 / 3 + 0.5) / 3, 6.5 / 3])
    assert np.allclose(pooled_variance(f, labels, 10.0), [10.0, 10.0])  # floored


def _blobs(n: int = 40) -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([rng.normal(0, 1, (n, 2)), rng.normal(4, 1, (n, 2))])


def _gmm(features: np.ndarray, **kw: object) -> np.ndarray:
    options = {"seed": 0, "reg_covar": 1e-6, "tol": 1e-12, "max_iter": 1000, **kw}
    return fit_class_gmm(features, 2, single_variance=np.ones(2), **options)


def test_em_stops_where_tol_and_max_iter_say() -> None:
    """One EM iteration, or a tolerance met at once, leave other rows than
    EM run to convergence (scikit-learn's own defaults would give the same
    rows to all three)."""
    x = _blobs()
    full = _gmm(x)
    assert not np.allclose(_gmm(x, max_iter=1), full)
    assert not np.allclose(_gmm(x, tol=10.0), full)


_REAL_GMM = sklearn.mixture.GaussianMixture


class _Warns:
    """GaussianMixture.fit warning twice: once about convergence, once about
    something else."""

    def __init__(self, *a: object, **kw: object) -> None:
        self.inner = _REAL_GMM(*a, **kw)

    def fit(self, x: np.ndarray) -> _Warns:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn("not converged", ConvergenceWarning, stacklevel=2)
        warnings.warn("something else", UserWarning, stacklevel=2)
        self.inner.fit(x)
        return self

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_only_convergence_warnings_are_silenced(monkeypatch) -> None:
    monkeypatch.setattr(sklearn.mixture, "GaussianMixture", _Warns)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _gmm(_blobs())
    assert [str(w.message) for w in seen] == ["something else"]


class _Overlapping(_Warns):
    """A GaussianMixture whose first fit waits (up to 1 s) for a second one
    to start, and whose second fit warns only after the first has
    returned: the interleaving of two clients fitting in threads."""

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    calls = 0

    def fit(self, x: np.ndarray) -> _Overlapping:
        from sklearn.exceptions import ConvergenceWarning

        type(self).calls += 1
        if type(self).calls == 1:
            self.first_in.set()
            self.second_in.wait(timeout=1.0)
        else:
            self.second_in.set()
            self.first_out.wait(timeout=5.0)
            warnings.warn("not converged", ConvergenceWarning, stacklevel=2)
        self.inner.fit(x)
        return self


def test_fits_in_two_threads_do_not_restore_each_others_silence(monkeypatch) -> None:
    """``catch_warnings`` swaps the process-wide filters: without the lock,
    the first fit to return would drop the second's ``ignore`` mid-fit."""
    monkeypatch.setattr(sklearn.mixture, "GaussianMixture", _Overlapping)
    monkeypatch.setattr(_Overlapping, "calls", 0)
    for event in ("first_in", "second_in", "first_out"):
        monkeypatch.setattr(_Overlapping, event, threading.Event())

    def first() -> None:
        _gmm(_blobs())
        _Overlapping.first_out.set()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = threading.Thread(target=first)
        a.start()
        assert _Overlapping.first_in.wait(timeout=5.0)
        b = threading.Thread(target=_gmm, args=(_blobs(),))
        b.start()
        a.join()
        b.join()
    assert _Overlapping.calls == 2 and [str(w.message) for w in seen] == []


def test_an_em_that_stops_early_says_so_once_in_the_log(caplog) -> None:
    x = _blobs()
    with caplog.at_level(logging.INFO, "osfl.methods.fedpft"):
        _gmm(x, max_iter=1)
    assert [r.getMessage() for r in caplog.records] == [
        "fedpft: EM stopped at max_iter=1 before tol=1e-12 (n=80, k=2)"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, "osfl.methods.fedpft"):
        _gmm(x, tol=1.0)
    assert caplog.records == []


def test_a_draw_is_the_mean_plus_eps_times_the_standard_deviation() -> None:
    """Components first, then one normal draw per feature, from one
    generator: replayed by hand."""
    rows = torch.tensor([[1.0, 0.0, 10.0, 1.0, 4.0], [3.0, -5.0, 0.0, 9.0, 0.25]])
    got = draw(rows, 6, torch.Generator().manual_seed(5), 1e-6)
    g = torch.Generator().manual_seed(5)
    comp = torch.multinomial(torch.tensor([0.25, 0.75]), 6, replacement=True, generator=g)
    eps = torch.randn(6, 2, generator=g)
    want = rows[comp, 1:3] + eps * rows[comp, 3:5].sqrt()
    torch.testing.assert_close(got, want)


def test_a_single_sample_class_gets_the_clients_pooled_variance(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    labels = ctx.splits.train.labels.numpy()
    keep = np.concatenate([np.flatnonzero(labels == 7)[:1], np.flatnonzero(labels == 2)[:6]])
    data = ctx.splits.train.subset(keep)
    cctx = ClientContext(ctx.run, 0, 0, torch.Generator())
    up = m.client_update(cctx, m.broadcast(m.init_state(), 0), data)
    feats = m.client_tokens(cctx, data, m.encoder())[:, 0].double().numpy()
    pooled = pooled_variance(feats, data.labels.numpy(), m.config.reg_covar)
    row = up.tensors["gmm.7"].double().numpy()
    assert row.shape == (1, 33) and np.allclose(row[0, 17:], pooled.astype(np.float16))


def test_a_client_refuses_an_encoder_it_was_not_announced(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = FedPFT(method_config(FedPFT, FAST_FEDPFT), ctx.run)
    data = ctx.splits.train.subset(np.arange(4))
    wrong = Broadcast(tensors={}, meta={"encoder_hash": "not-this-one"})
    with pytest.raises(ConfigError, match="client 2: the server announced encoder weights"):
        m.client_update(ClientContext(ctx.run, 2, 0, torch.Generator()), wrong, data)


def test_without_any_mixture_the_server_says_why(tiny) -> None:
    m = FedPFT(method_config(FedPFT, {**FAST_FEDPFT, "components": 3}), seed_ctx(tiny).run)
    nothing = Upload(tensors={}, meta={"num_samples": 2, "class_counts": [2] + [0] * 9})
    with pytest.raises(ConfigError) as e:
        m.synthetic_features({0: nothing})
    assert str(e.value) == (
        "fedpft: no client sent a mixture (with small_classes='drop' every class needs more "
        "than components=3 samples)"
    )


def test_the_server_fit_is_the_flower_baselines_adamw() -> None:
    assert FedPFTConfig().server_fit == FitConfig(
        epochs=50, batch_size=32, optimizer="adamw", lr=1e-4, weight_decay=0.01
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"components": 0}, "components must be >= 1, got 0"),
        ({"small_classes": "keep"}, "small_classes must be one of fewer, drop, got 'keep'"),
        ({"reg_covar": 0.0}, "reg_covar and tol must be > 0 and max_iter >= 1"),
        ({"tol": 0.0}, "reg_covar and tol must be > 0 and max_iter >= 1"),
        ({"max_iter": 0}, "reg_covar and tol must be > 0 and max_iter >= 1"),
    ],
)
def test_options_are_refused_at_their_bounds(options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        FedPFTConfig(**options)
    assert str(e.value) == message


def test_the_least_allowed_options_are_accepted() -> None:
    least = FedPFTConfig(components=1, reg_covar=1e-12, tol=1e-12, max_iter=1)
    assert (least.components, least.max_iter) == (1, 1)
