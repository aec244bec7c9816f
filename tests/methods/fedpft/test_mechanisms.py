"""Mechanism tests of FedPFT (Beitollahi et al., 2024), each failing when the
paper's key component is removed or inverted: the client's mixture is fitted
to that class's features (EM keeps its mean and variance), and the server's
features are drawn from the uploaded mixture (means, variances and weights
each move the draws as they should)."""

from __future__ import annotations

import numpy as np
import torch

from osfl.config import method_config
from osfl.fl.upload import Upload
from osfl.methods.fedpft import FedPFT, fit_class_gmm, sample_gmm_rows
from support.tiny import split_ctx


def test_fedpft_mixture_keeps_the_class_mean_and_variance() -> None:
    """EM's M-step: Σ w_k μ_k is the class's feature mean and Σ w_k (σ²_k +
    μ_k²) − mean² its per-dimension variance (plus ``reg_covar``), whatever
    the components: the upload summarises *that* class's features."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 0.5, (40, 3)), rng.normal(3, 1.5, (25, 3))])
    rows = fit_class_gmm(
        x, 4, seed=1, reg_covar=1e-3, tol=1e-3, max_iter=20, single_variance=np.ones(3)
    )
    w, mu, var = rows[:, 0], rows[:, 1:4], rows[:, 4:]
    mean = w @ mu
    np.testing.assert_allclose(mean, x.mean(0), atol=1e-10)
    np.testing.assert_allclose(w @ (var + mu**2) - mean**2, x.var(0) + 1e-3, rtol=1e-6)


def rows_of(weights: list[float], means: list[list[float]], var: list[list[float]]) -> torch.Tensor:
    return torch.cat(
        [torch.tensor(weights)[:, None], torch.tensor(means), torch.tensor(var)], 1
    ).half()


def test_fedpft_server_draws_move_with_the_uploaded_mixture(vit_task) -> None:
    """The same seeds, one class's mixture changed: its means shifted by δ
    shift its draws by exactly δ; its variances ×4 double each draw's offset
    from its component mean; all weight on one component puts every draw
    there. The other classes' draws do not move."""
    ctx = split_ctx(vit_task, 1, None, scheme="iid")
    m = FedPFT(method_config(FedPFT), ctx.run)
    base = rows_of([0.5, 0.5], [[-4.0, 0.0], [4.0, 1.0]], [[0.25, 1.0], [1.0, 0.25]])
    other = rows_of([1.0], [[0.0, 9.0]], [[0.5, 0.5]])

    def draws(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        meta = {"num_samples": 900, "class_counts": [0, 0, 0, 600, 0, 0, 300, 0, 0, 0]}
        return m.synthetic_features({0: Upload({"gmm.3": rows, "gmm.6": other}, meta)})

    x, y = draws(base)
    assert np.bincount(y.numpy(), minlength=10).tolist() == [0, 0, 0, 600, 0, 0, 300, 0, 0, 0]
    c3 = y == 3
    shifted = base.clone()
    shifted[:, 1:3] += torch.tensor([1.5, -2.0]).half()
    xs, _ = draws(shifted)
    assert torch.allclose(xs[c3] - x[c3], torch.tensor([1.5, -2.0]), atol=1e-5)
    assert torch.equal(xs[~c3], x[~c3])
    wide = base.clone()
    wide[:, 3:] *= 4
    xw, _ = draws(wide)
    comp = (x[c3, 0] > 0).long()  # the component each draw came from (well separated)
    centre = base[:, 1:3].float()[comp]
    assert torch.allclose(xw[c3] - centre, 2 * (x[c3] - centre), atol=1e-5)
    one = base.clone()
    one[:, 0] = torch.tensor([0.0, 1.0]).half()
    xo, _ = draws(one)
    assert bool((xo[c3, 0] > 0).all())
    assert abs(float(x[c3, 0].gt(0).double().mean()) - 0.5) < 0.1
    # the draws follow each component's variance
    assert abs(float(x[c3][comp == 0, 0].std()) - 0.5) < 0.08
    assert abs(float(x[c3][comp == 1, 1].std()) - 0.5) < 0.08


def test_fedpft_sampling_reads_weights_means_and_variances_from_their_columns() -> None:
    """Rows [weight, mean (D), variance (D)]: a one-component mixture's draws
    have that mean and that variance per dimension."""
    rows = torch.tensor([[1.0, 2.0, -1.0, 0.5, 0.04, 4.0, 1.0]])
    x = sample_gmm_rows(rows, 20000, torch.Generator().manual_seed(0), 1e-6)
    np.testing.assert_allclose(x.mean(0).numpy(), [2.0, -1.0, 0.5], atol=0.05)
    np.testing.assert_allclose(x.var(0).numpy(), [0.04, 4.0, 1.0], rtol=0.05)
