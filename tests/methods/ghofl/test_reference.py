"""GH-OFL against the authors' public code on fixed inputs.

Reference: github.com/FabioTur-dev/One-Shot-FL at commit
fd6daf2e0f98ecbc079f96966240c740a4b901f2 (the ICLR 2026 camera-ready code):
``client/run_client_backbones.py::aggregate_client_stats_x`` and, in
``server/GH_OFL_server.py``, ``aggregate_clients_x``, ``logits_nbdiag_cpu``,
``logits_lda_cpu``, ``QDAFullFastGPU``, ``fisher_subspace``,
``synthesize_fisher``, ``build_gaussians_fisher``, ``lda_scores_f`` and
``nb_scores_f``, with the README's CIFAR-10 settings. The repository has no
licence, so only the values those functions return are stored
(``tests/fixtures/frozen/ghofl_reference.safetensors``; inputs in
``inputs.safetensors``; how they were made: ``tests/fixtures/README.md``).

float64 quantities agree to 1e-9 relative (in practice ~1e-13); the authors'
float32 outputs (their QDA, the Fisher-space scores, the synthetic features)
to float32 rounding. Deliberate differences, each tested below:

- nb: osfl's variances are unbiased (÷ (n_c − 1)), the authors' biased (÷ n_c);
- qda/nb: osfl's scores are log p(f, c), the authors' omit −(D/2) log 2π;
- ridge: the authors add an absolute 1e-6·I to the x-space covariances, osfl
  a scale-free ``ridge``·tr(Σ_W)/D·I (off by default): the heads agree when
  ``ridge`` = 1e-6·D/tr Σ_W (their evaluation adds it twice to lda's: 2e-6);
- Σ_W: osfl divides by N − K (classes held), the authors by N − C;
- Fisher directions: the same up to sign; osfl fixes each column's sign;
- FisherMix: osfl's head is the cosine-margin one (the 2026-02 server and
  the abstract), the 2026-03 server trains a plain linear head.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from osfl.methods.fedcgs import GaussianHead
from osfl.methods.ghofl.closed_form import (
    GaussianClassHead,
    class_gaussians,
    class_moments,
    gaussian_head,
)
from osfl.methods.ghofl.learned import (
    JITTER,
    FisherMixHead,
    LearnedSetup,
    fisher_gaussians,
    fisher_subspace,
    nb_fisher_logits,
    synthesize,
    synthetic_gaussians,
)
from support.paths import FIXTURES
from support.tiny import close

DATA = FIXTURES / "frozen"
#: The authors' CIFAR-10 config (configs/cifar10.yaml).
LDA_SHRINK, QDA_SHRINK, ENERGY, MAX_K = 0.05, 0.1, 0.995, 16
SYN_SHRINK, TAU, SEED, PER_CLASS = 0.05, 0.9, 42, 32
MIN_EPS = 1e-6  # the authors' absolute jitter


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return load_file(DATA / "inputs.safetensors")


@pytest.fixture(scope="module")
def ref() -> dict[str, torch.Tensor]:
    return load_file(DATA / "ghofl_reference.safetensors")


def dense(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    return inputs["dense.features"], inputs["dense.labels"], int(inputs["dense.num_classes"])


def stats(
    inputs: dict[str, torch.Tensor], head: str, tag: str = "dense"
) -> dict[str, torch.Tensor]:
    f, y = inputs[f"{tag}.features"], inputs[f"{tag}.labels"]
    return class_moments(f, y, int(inputs[f"{tag}.num_classes"]), head)


def ridge_for(pooled: torch.Tensor, absolute: float) -> float:
    """osfl's scale-free ridge that adds ``absolute``·I."""
    return absolute / (float(pooled.diagonal().sum()) / pooled.shape[0])


def test_client_statistics_are_the_authors_per_client_sums(inputs, ref) -> None:
    """class_moments = aggregate_client_stats_x on each client's features:
    A (class sums), SUMSQ (nb), S (qda's per-class second moments), B (lda),
    N (counts)."""
    f, y, c = dense(inputs)
    clients = inputs["dense.clients"]
    for k in range(int(clients.max()) + 1):
        own = clients == k
        qda = class_moments(f[own], y[own], c, "qda")
        theirs = {
            key[len(f"dense.client{k}.") :]: t
            for key, t in ref.items()
            if key.startswith(f"dense.client{k}.")
        }
        assert torch.equal(qda["class_counts"], theirs["N_per_class"])
        close(qda["class_sums"], theirs["A_per_class_x"], 1e-12)
        close(qda["class_second_moments"], theirs["S_per_class_x"], 1e-12)
        close(
            class_moments(f[own], y[own], c, "nb")["class_squares"],
            theirs["SUMSQ_per_class_x"],
            1e-12,
        )
        close(class_moments(f[own], y[own], c, "lda")["second_moment"], theirs["B_global_x"], 1e-12)


def test_server_moments_are_aggregate_clients_x(inputs, ref) -> None:
    """μ_c, the class covariances Σ_c (÷ (n_c − 1)) and Σ_W from the summed
    statistics equal the authors' aggregate_clients_x."""
    st = stats(inputs, "qda")
    mu, sigma, pooled, present = class_gaussians(
        st["class_sums"], st["class_counts"], st["class_second_moments"]
    )
    assert bool(present.all())
    close(mu, ref["dense.mu"], 1e-12)
    close(sigma, ref["dense.Sigma_cls"], 1e-12)
    close(pooled, ref["dense.Sigma_pool"], 1e-12)
    n = st["class_counts"].double()
    close((n / n.sum()).log(), ref["dense.logp"], 1e-12)


def test_pooled_covariance_divides_by_the_classes_held(inputs, ref) -> None:
    """Deliberate difference: with a class held by nobody (class 5) osfl's Σ_W
    is M_W/(N − K), the authors' M_W/(N − C); a class with one sample (class
    4) gets Σ_W as its covariance in both."""
    st = stats(inputs, "qda", "sparse")
    mu, sigma, pooled, present = class_gaussians(
        st["class_sums"], st["class_counts"], st["class_second_moments"]
    )
    n, k, c = int(st["class_counts"].sum()), int(present.sum()), len(present)
    assert (k, c) == (5, 6) and st["class_counts"].tolist()[4:] == [1, 0]
    close(pooled * (n - k) / (n - c), ref["sparse.Sigma_pool"], 1e-12)
    assert torch.equal(sigma[4], pooled)  # one sample: the pooled covariance
    close(sigma[:4], ref["sparse.Sigma_cls"][:4], 1e-12)
    close(mu[:5], ref["sparse.mu"][:5], 1e-12)


def test_qda_is_the_authors_qda_full(inputs, ref) -> None:
    """QDAFullFastGPU (shrink_cov(Σ_c, 0.1) + 1e-6·I, Cholesky) scores, run in
    float64 (its source with float32 replaced) and as published (float32),
    equal osfl's qda head with the matching ridge plus (D/2) log 2π (osfl's
    scores are the full log density)."""
    st = stats(inputs, "qda")
    _, _, pooled, _ = class_gaussians(
        st["class_sums"], st["class_counts"], st["class_second_moments"]
    )
    p = gaussian_head(
        "qda",
        st["class_sums"],
        st["class_counts"],
        st["class_second_moments"],
        shrinkage=QDA_SHRINK,
        ridge=ridge_for(pooled, MIN_EPS),
    )
    x = inputs["dense.test"]
    ours = GaussianClassHead(p["mean"], p["whiten"], p["const"])(x)
    d = x.shape[1]
    close(ours + 0.5 * d * math.log(2 * math.pi), ref["qda_logits64"])
    close(ours + 0.5 * d * math.log(2 * math.pi), ref["qda_logits32"], 1e-6)
    assert torch.equal(ours.argmax(1), ref["qda_logits32"].argmax(1))


@pytest.mark.parametrize(
    "key,absolute", [("lda_logits", MIN_EPS), ("lda_logits_eval", 2 * MIN_EPS)]
)
def test_lda_is_the_authors_lda(inputs, ref, key: str, absolute: float) -> None:
    """logits_lda_cpu(x, μ, Σ_W, log π, 0.05) from FedCGS's upload (B = Σ f fᵀ):
    osfl's lda with the ridge that adds the same absolute jitter (the server's
    evaluation path shrinks Σ_W, adds 1e-6·I and calls logits_lda_cpu with
    shrink 0, which adds 1e-6·I again)."""
    st = stats(inputs, "lda")
    pooled = ref["dense.Sigma_pool"]
    p = gaussian_head(
        "lda",
        st["class_sums"],
        st["class_counts"],
        st["second_moment"],
        shrinkage=LDA_SHRINK,
        ridge=ridge_for(pooled, absolute),
    )
    close(GaussianHead(p["weight"], p["bias"])(inputs["dense.test"]), ref[key])


def test_nb_differs_from_the_authors_only_by_the_unbiased_variance(inputs, ref) -> None:
    """Deliberate difference: logits_nbdiag_cpu given the unbiased variances
    (their Var_diag · n_c/(n_c − 1)) is osfl's nb head (λ = 0) + (D/2) log 2π;
    with the authors' own, biased, variances the scores differ."""
    st = stats(inputs, "nb")
    p = gaussian_head(
        "nb", st["class_sums"], st["class_counts"], st["class_squares"], shrinkage=0.0
    )
    x = inputs["dense.test"]
    ours = GaussianClassHead(p["mean"], p["whiten"], p["const"])(x) + 2.5 * math.log(2 * math.pi)
    close(ours, ref["nb_logits_unbiased"])
    assert float((ours - ref["nb_logits"]).abs().max()) > 0.1
    n = st["class_counts"].double()[:, None]
    close(1.0 / p["whiten"].square(), ref["dense.Var_diag"] * n / (n - 1), 1e-12)


def test_fisher_subspace_is_the_authors_up_to_sign(inputs, ref) -> None:
    """fisher_subspace (S_W = shrink(Σ_W, 0.05) + 1e-6·I, energy 0.995): the
    same k and the same directions; deliberate difference: each column's sign
    is fixed (U = S_W^{1/2} V has its largest-magnitude entry positive), the
    authors' is whatever eigh returns."""
    mu, pri, pooled = ref["dense.mu"], ref["dense.pri"], ref["dense.Sigma_pool"]
    v = fisher_subspace(mu, pri, pooled, shrinkage=LDA_SHRINK, energy=ENERGY, max_dim=MAX_K)
    theirs = ref["fisher_V"]
    assert v.shape == theirs.shape == (5, int(ref["fisher_k"]))
    signs = (v * theirs).sum(0).sign()
    close(v, theirs * signs, 1e-9)
    assert bool((signs < 0).any())  # this fixture has a flipped column
    d = pooled.shape[0]
    sw = (
        (1 - LDA_SHRINK) * pooled
        + LDA_SHRINK * pooled.trace() / d * torch.eye(d, dtype=torch.float64)
        + JITTER * torch.eye(d, dtype=torch.float64)
    )
    evals, evecs = torch.linalg.eigh(sw)
    u = (evecs * evals.sqrt()) @ evecs.T @ v
    lead = u.abs().argmax(0)
    assert bool((u[lead, torch.arange(u.shape[1])] > 0).all())


@pytest.mark.parametrize("covariance", ["class", "pooled"])
def test_synthetic_features_are_the_authors_draws(inputs, ref, covariance: str) -> None:
    """synthesize_fisher(seed 42, τ 0.9, λ_s 0.05; class or pooled covariance)
    after set_seed(42) draws per class from torch's global generator; osfl
    draws all classes at once from a generator seeded 42: with 32 features per
    class (a multiple of 16) torch returns the same normals, so osfl's
    features, given the authors' V, are theirs to float32 rounding (they keep
    float32)."""
    st = stats(inputs, "qda")
    mu, sigma, pooled, _ = class_gaussians(
        st["class_sums"], st["class_counts"], st["class_second_moments"]
    )
    mean, cov = synthetic_gaussians(
        mu, sigma, pooled, ref["fisher_V"], covariance=covariance, shrinkage=SYN_SHRINK, scale=TAU
    )
    z, y = synthesize(mean, cov, PER_CLASS, torch.Generator().manual_seed(SEED))
    assert torch.equal(y, ref[f"synthetic_{covariance}_labels"])
    close(z, ref[f"synthetic_{covariance}"], 1e-6)


def test_fisher_space_gaussians_are_the_authors(inputs, ref) -> None:
    """build_gaussians_fisher + lda_scores_f / nb_scores_f (Proto-Hyper's
    teacher parts and its NB_f base): the Fisher means, the spherical variance
    σ² = tr Σ_f / k (float64) and both heads' scores on z = f V (theirs in
    float32)."""
    mu, pri, pooled, v = ref["dense.mu"], ref["dense.pri"], ref["dense.Sigma_pool"], ref["fisher_V"]
    present = torch.ones(len(mu), dtype=torch.bool)
    setup = LearnedSetup(present, v, mu, pri.log(), pooled, torch.zeros(0, 3), torch.zeros(0))
    g = fisher_gaussians(setup, LDA_SHRINK)
    close(g["mean"], ref["fisher_mu_f"], 1e-12)
    close(g["sigma2"], ref["fisher_sigma2_nb"], 1e-12)
    z = inputs["dense.test"] @ v
    close(z @ g["lda_weight"] + g["lda_bias"], ref["fisher_lda_scores"], 1e-6)
    close(nb_fisher_logits(z, g["mean"], pri.log(), g["sigma2"]), ref["fisher_nb_scores"], 1e-6)


def test_fishermix_is_a_cosine_head_not_the_authors_linear_head() -> None:
    """Deliberate difference: FisherMix scores s·cos(f V, w_c) (the abstract's
    "linear head with cosine margin", the 2026-02 server); the 2026-03 server's
    plain linear head would scale with f, this one does not."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(5, 3, generator=g, dtype=torch.float64)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    head = FisherMixHead(v, w, torch.zeros(4, dtype=torch.float64), torch.tensor(30.0))
    f = torch.randn(6, 5, generator=g, dtype=torch.float64)
    close(head(3.0 * f), head(f), 1e-12)
    cos = torch.nn.functional.cosine_similarity((f @ v)[:, None], w[None], dim=-1)
    close(head(f), 30.0 * cos, 1e-12)
