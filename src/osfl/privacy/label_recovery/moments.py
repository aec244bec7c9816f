"""Logit statistics on an auxiliary set: RLU's Gaussian model of the logits.

RLU [Chen & Vikalo, ICML 2024, §3.2] models the logits of a sample of class
``n`` as ``q ~ N(mu_n, Sigma_n)`` (Assumption 3.1), fits ``mu_n, Sigma_n`` on
an auxiliary set with a few samples per class, and estimates the expected
"erroneous confidence"

    S[n, j] = E_{q ~ N(mu_n, Sigma_n)} softmax(q)_j            (Eq. 6, Eq. 8)

by Monte Carlo with ``M`` samples. The coefficient matrix of the bias update
(Eq. 9/10, Alg. 1 lines 2–8) is then

    C[j, j] = sum_{n != j} S[j, n]       (= 1 - S[j, j])
    C[j, n] = -S[n, j]                   (n != j)

so that ``E[Δb] / η = C @ N / |B|`` for the label counts ``N`` of one SGD
step (Eq. 9). Indices here are (row = bias component j, column = class n);
the paper writes the transpose, ``a_{n,j}``.

The Monte Carlo draws use common random numbers: one standard-normal block
``E`` (per class, ``M × K``) is drawn once and reused for every mean, so the
posterior search (Alg. 2), which re-evaluates ``S`` for many candidate means,
sees a smooth function of the means rather than fresh noise each time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from osfl.errors import DataError

Transform = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LogitGaussians:
    """Per-class Gaussian fits of the logits: ``mean[n]`` (K,), ``chol[n]`` (K, K)."""

    mean: np.ndarray  # (N, K): row n = mean logits of class-n samples
    chol: np.ndarray  # (N, K, K): Cholesky factor of the (ridged) covariance of class n
    counts: np.ndarray  # (N,): auxiliary samples of each class

    @property
    def num_classes(self) -> int:
        return int(self.mean.shape[0])


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@torch.no_grad()
def aux_outputs(
    model: nn.Module,
    images: torch.Tensor,
    *,
    transform: Transform | None = None,
    batch_size: int = 256,
    bn_stats: str = "batch",
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (N×K) and last-layer inputs (N×L), float64, of uint8 ``images``.

    The features are what ``model.get_classifier()`` receives (captured by a
    forward hook), i.e. the embedding ``e`` of RLU §3.1 / LLG / ZLG / iRLG.

    ``bn_stats="batch"`` evaluates BatchNorm with the statistics of chunks of
    ``batch_size`` images in a seeded random order, as in the client's training
    steps (the logits RLU models are those the client's loss saw); the running
    statistics of ``model`` are left untouched. ``"running"`` uses the stored
    statistics (plain ``eval()``). Dropout is always off. Without BatchNorm
    both give the same result.
    """
    if bn_stats not in ("batch", "running"):
        raise DataError(f"bn_stats must be 'batch' or 'running', got {bn_stats!r}")
    n = images.shape[0]
    if n == 0:
        raise DataError("the auxiliary set is empty")
    head = model.get_classifier()
    feats: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda mod, inp, out: feats.append(inp[0].detach()))
    was_training = model.training
    model.eval()
    saved: list[tuple[nn.Module, float | None]] = []
    use_batch = bn_stats == "batch" and has_batchnorm(model)
    if use_batch:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                # momentum 0 keeps the running stats while train-mode forward uses batch stats
                saved.append((m, m.momentum))
                m.momentum = 0.0
                m.train()
    order = (
        torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        if use_batch
        else torch.arange(n)
    )
    try:
        out = []
        for start in range(0, n, batch_size):
            xb = images[order[start : start + batch_size]].to(device)
            x = transform(xb) if transform is not None else xb.float() / 255.0
            try:
                out.append(model(x).double().cpu())
            except RuntimeError as e:  # e.g. 1-channel images into a 3-channel model
                raise DataError(
                    f"the observed model cannot read the auxiliary images (after the "
                    f"transform, shape {tuple(x.shape[1:])}, C×H×W): {str(e).splitlines()[0]}; "
                    "load the auxiliary set with the run's channels and image size "
                    "(e.g. load_data(..., channels=3, image_size=32))"
                ) from e
    finally:
        hook.remove()
        for m, mom in saved:
            m.momentum = mom
        model.train(was_training)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n)
    logits = torch.cat(out)[inv]
    features = torch.cat([f.double().cpu().flatten(1) for f in feats])[inv]
    return logits, features


def fit_gaussians(
    logits: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    num_classes: int,
    *,
    ridge: float = 1e-6,
) -> LogitGaussians:
    """Mean and covariance of the logits of each class (Assumption 3.1).

    A class with one sample gets a zero covariance (+ ridge); a class with none
    is an error, since RLU needs ``S[n, :]`` for every class ``n``. The ridge
    (relative to the mean variance) keeps the Cholesky factor defined when the
    logits are (nearly) degenerate, e.g. a model whose last layer is all zeros.
    """
    q = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if q.ndim != 2 or q.shape[1] != num_classes or y.shape != (q.shape[0],):
        raise DataError(
            f"fit_gaussians: logits must be (n, {num_classes}) with one label each; "
            f"got {q.shape} and {y.shape}"
        )
    K = num_classes
    means = np.zeros((K, K))
    chols = np.zeros((K, K, K))
    counts = np.bincount(y, minlength=K)
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise DataError(
            f"the auxiliary set has no sample of class(es) {missing.tolist()}; "
            "RLU needs a few samples of every class"
        )
    for n in range(K):
        qn = q[y == n]
        means[n] = qn.mean(axis=0)
        cov = np.cov(qn, rowvar=False) if qn.shape[0] > 1 else np.zeros((K, K))
        cov = np.atleast_2d(cov)
        eps = ridge * max(float(np.trace(cov)) / K, 1e-12)
        chols[n] = np.linalg.cholesky(cov + eps * np.eye(K))
    return LogitGaussians(means, chols, counts)


class ConfidenceSampler:
    """Monte Carlo ``S[n, j]`` (Eq. 8) with common random numbers.

    ``noise`` (N, M, K) is drawn once from a seeded generator; ``S(mean)``
    evaluates ``E softmax(mean[n] + chol[n] @ eps)`` for any means, reusing it.
    """

    def __init__(self, gauss: LogitGaussians, num_samples: int, seed: int = 0):
        if num_samples < 1:
            raise DataError(f"num_samples (M) must be >= 1, got {num_samples}")
        rng = np.random.default_rng(seed)
        K = gauss.num_classes
        self.gauss = gauss
        eps = rng.standard_normal((K, num_samples, K))
        # offsets[n] = eps[n] @ chol[n].T: the zero-mean part of the samples of class n
        self.offsets = np.einsum("nmk,nlk->nml", eps, gauss.chol)

    def S(self, mean: np.ndarray | None = None) -> np.ndarray:
        """(N, K) matrix ``S[n, j]`` for the given class means (default: the fitted ones)."""
        mu = self.gauss.mean if mean is None else np.asarray(mean, dtype=np.float64)
        q = self.offsets + mu[:, None, :]
        q = q - q.max(axis=2, keepdims=True)
        p = np.exp(q)
        p /= p.sum(axis=2, keepdims=True)
        return p.mean(axis=1)


def coefficient_matrix(S: np.ndarray) -> np.ndarray:
    """RLU's ``C`` (Alg. 1 lines 2–8) with ``E[Δb]/η = C @ N / |B|``.

    ``C[j, j] = sum_{n != j} S[j, n]`` and ``C[j, n] = -S[n, j]`` for ``n != j``.
    Each column sums to zero, as the bias gradient of softmax-CE does.
    """
    S = np.asarray(S, dtype=np.float64)
    off = S - np.diag(np.diag(S))
    C = -off.T
    C[np.diag_indices_from(C)] = off.sum(axis=1)
    return C
