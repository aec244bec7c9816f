"""Mechanism tests of FedCGS (Guan et al., AAAI 2025), each failing when the
paper's key component is removed or inverted: the head is built from the
*global* statistics: every client's class counts enter it (permuting one
client's counts changes it), the prior is the global class frequency, and the
covariance is the total one of all clients' features."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from osfl.config import method_config
from osfl.fl.upload import Upload
from osfl.methods.fedcgs import FedCGS, client_statistics, lda_head
from support.tiny import split_ctx


def gaussian_classes(seed: int, n: int = 40, d: int = 4, classes: int = 3) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, d, generator=g, dtype=torch.float64) * 2
    f = torch.cat(
        [means[c] + torch.randn(n, d, generator=g, dtype=torch.float64) for c in range(classes)]
    )
    return f, torch.arange(classes).repeat_interleave(n)


def uploads_of(parts: list[tuple[torch.Tensor, torch.Tensor]], classes: int) -> dict[int, Upload]:
    out = {}
    for i, (f, y) in enumerate(parts):
        st = client_statistics(f, y, classes)
        counts = [int(n) for n in st.pop("class_counts")]
        out[i] = Upload(tensors=st, meta={"num_samples": len(y), "class_counts": counts})
    return out


def test_fedcgs_head_uses_every_clients_class_counts(tiny) -> None:
    """The server's head is the one of all features at once; permuting the
    class counts one client reports (its sums unchanged) changes it."""
    m = FedCGS(method_config(FedCGS), split_ctx(tiny, 2, None, scheme="iid").run)
    f, y = gaussian_classes(0, classes=10)
    half = torch.arange(len(y)) % 3 == 0
    ups = uploads_of([(f[half], y[half]), (f[~half], y[~half])], 10)
    state = m.aggregate(m.init_state(), ups, 0)
    st = client_statistics(f, y, 10)
    w, b = lda_head(st["class_sums"], st["class_counts"], st["second_moment"], shrinkage=1e-4)
    assert torch.allclose(state["weight"], w, rtol=1e-9, atol=1e-9 * float(w.abs().max()))
    assert torch.allclose(state["bias"], b, rtol=1e-9, atol=1e-9)
    counts = list(ups[1].meta["class_counts"])
    counts[0], counts[1] = counts[1], counts[0] + 1
    counts[2] -= 1
    assert counts != ups[1].meta["class_counts"] and sum(counts) == ups[1].meta["num_samples"]
    lying = {0: ups[0], 1: Upload(ups[1].tensors, {**ups[1].meta, "class_counts": counts})}
    other = m.aggregate(m.init_state(), lying, 0)
    assert float((other["weight"] - w).abs().max()) > 1e-3 * float(w.abs().max())
    assert float((other["bias"] - b).abs().max()) > 1e-3


def test_fedcgs_prior_is_the_global_class_frequency() -> None:
    """b_c + ½ μ_cᵀ W_c = log(n_c / N): the log prior of the pooled counts;
    a class with more samples (same features) gets exactly log 2 more."""
    f, y = gaussian_classes(1)
    st = client_statistics(f, y, 3)
    w, b = lda_head(st["class_sums"], st["class_counts"], st["second_moment"], shrinkage=1e-4)
    mu = st["class_sums"] / st["class_counts"][:, None]
    n = st["class_counts"].double()
    assert torch.allclose(b + 0.5 * (mu * w).sum(1), (n / n.sum()).log(), atol=1e-12)
    # class 0 twice (each sample duplicated): the prior ratio doubles
    f2, y2 = torch.cat([f, f[y == 0]]), torch.cat([y, y[y == 0]])
    st2 = client_statistics(f2, y2, 3)
    _, b2 = lda_head(st2["class_sums"], st2["class_counts"], st2["second_moment"], shrinkage=0)
    mu2 = st2["class_sums"] / st2["class_counts"][:, None]
    w2, _ = lda_head(st2["class_sums"], st2["class_counts"], st2["second_moment"], shrinkage=0)
    prior2 = b2 + 0.5 * (mu2 * w2).sum(1)
    assert float(prior2[0] - prior2[1]) == pytest.approx(math.log(2 * 40 / 40), abs=1e-12)


def test_fedcgs_covariance_is_the_total_one() -> None:
    """``total`` (FedCGS): Σ = (B − N μ̄ μ̄ᵀ)/(N − 1), the covariance of all
    features including the spread between class means; ``within`` removes
    it. Both from the same upload, both exact."""
    f, y = gaussian_classes(2)
    st = client_statistics(f, y, 3)
    mu = st["class_sums"] / st["class_counts"][:, None]
    for covariance, sigma in (
        ("total", torch.cov(f.T)),
        ("within", sum((f[y == c] - mu[c]).T @ (f[y == c] - mu[c]) for c in range(3)) / (120 - 3)),
    ):
        w, _ = lda_head(
            st["class_sums"],
            st["class_counts"],
            st["second_moment"],
            shrinkage=0.0,
            covariance=covariance,
        )
        assert torch.allclose(w, torch.linalg.solve(sigma, mu.T).T, rtol=1e-9, atol=1e-9)
