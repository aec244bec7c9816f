"""Linear probing of a frozen encoder: the standard test of what its features hold.

The protocol of the self-supervised literature (DINO §4.1, MAE §4): freeze
the encoder, extract its pooled feature of every image (no augmentation), fit
a linear classifier on the train features and report its test accuracy. The
classifier is scikit-learn's multinomial logistic regression on standardised
features (as the DINO paper's k-NN/linear evaluations, a cheap and
deterministic fit), its inverse regularisation ``C`` chosen on a stratified
20 % validation split of the train features from a small grid, then refitted
on all of them.

Used twice: :func:`osfl.pretrain.train.pretrain` fits the head of a
self-supervised encoder on the upstream images (so the written file has a
real head, and the card a held-out accuracy), and ``benchmarks/linear_probe.py``
compares encoders on a disjoint task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import Transform
from osfl.fl.progress import Progress

#: Regularisation grid (inverse strength) searched on the validation split.
C_GRID = (0.01, 0.1, 1.0, 10.0)


@torch.no_grad()
def extract_features(
    model: nn.Module,
    data: ImageSet,
    transform: Transform,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
    progress: Progress | None = None,
) -> np.ndarray:
    """(N, D) float32 pooled features (``model.forward_features``) in eval mode."""
    device = torch.device(device)
    model = model.to(device).eval()
    out = []
    total = -(-len(data) // batch_size)
    with (progress or Progress()).task("features", total) as bar:
        for i in range(0, len(data), batch_size):
            x = transform(data.images[i : i + batch_size].to(device))
            out.append(model.forward_features(x).float().cpu())  # type: ignore[operator]
            bar.advance()
    return torch.cat(out).numpy()


@dataclass(frozen=True)
class LinearProbe:
    """A fitted probe: standardisation, the classifier's weights, the chosen C."""

    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray  # (num_classes, D) on standardised features
    bias: np.ndarray  # (num_classes,)
    C: float
    val_accuracy: float

    def logits(self, feats: np.ndarray) -> np.ndarray:
        return ((feats - self.mean) / self.scale) @ self.weight.T + self.bias

    def accuracy(self, feats: np.ndarray, labels: np.ndarray) -> float:
        return float((self.logits(feats).argmax(1) == np.asarray(labels)).mean())

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of an ``nn.Linear`` on *raw* features computing the
        same logits: the standardisation folded in."""
        w = self.weight / self.scale
        b = self.bias - w @ self.mean
        return torch.from_numpy(w).float(), torch.from_numpy(b).float()


def _fit(
    x: np.ndarray, y: np.ndarray, num_classes: int, c: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Logistic regression with inverse regularisation ``c``; (weight, bias) rows for
    every class (sklearn drops classes absent from ``y`` and keeps one row for two)."""
    # heavy: scikit-learn (~1 s; only the linear probe needs it)
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=c, max_iter=1000, random_state=seed)
    clf.fit(x, y)
    w = np.zeros((num_classes, x.shape[1]))
    b = np.zeros(num_classes)
    present = clf.classes_.astype(int)
    if len(present) == 2:  # sklearn keeps one row for two classes: logit(1) - logit(0)
        w[present[1]], b[present[1]] = clf.coef_[0], clf.intercept_[0]
    else:
        w[present], b[present] = clf.coef_, clf.intercept_
    b[np.setdiff1d(np.arange(num_classes), present)] = -1e9  # absent classes never win
    return w, b


def fit_linear_probe(
    feats: np.ndarray,
    labels: np.ndarray | torch.Tensor,
    num_classes: int,
    *,
    grid: Sequence[float] = C_GRID,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> LinearProbe:
    """Standardise, pick C on a stratified validation split, refit on everything."""
    # heavy: scikit-learn (~1 s; only the linear probe needs it)
    from sklearn.model_selection import train_test_split

    y = np.asarray(labels, dtype=np.int64)
    x = np.asarray(feats, dtype=np.float64)
    mean = x.mean(0)
    scale = x.std(0)
    scale[scale < 1e-12] = 1.0
    z = (x - mean) / scale
    tr, va = train_test_split(
        np.arange(len(y)), test_size=val_fraction, random_state=seed, stratify=y
    )
    scores = []
    for c in grid:
        w, b = _fit(z[tr], y[tr], num_classes, c, seed)
        scores.append(float(((z[va] @ w.T + b).argmax(1) == y[va]).mean()))
    best = int(np.argmax(scores))  # ties: the strongest regularisation (grid ascending)
    w, b = _fit(z, y, num_classes, grid[best], seed)
    return LinearProbe(mean, scale, w, b, float(grid[best]), scores[best])
