"""Test-set evaluation of a Predictor: global, per-class, per-client, local accuracy.

Metrics follow the one-shot FL papers: *global test accuracy* of the server's
predictor on the held-out test set (FedMITR, FALCON, FAFI tables); for the
``local`` floor (one model per client, ``PerClientPredictor``) the mean of the
clients' accuracies on that same test set (a method whose clients keep models
of their own is scored likewise, from each client's score of its own model:
:mod:`osfl.fl.own_models`); and, optionally, each client's
*local test accuracy*: its accuracy on the global test set re-weighted by the
client's training class proportions, the usual stand-in for a local test set
drawn from the client's own label distribution in personalised-FL evaluation
(e.g. FedRep, Collins et al., ICML 2021; pFedMe, T. Dinh et al., NeurIPS 2020).

Everything runs under ``torch.no_grad`` in eval mode on whole batches; each
test batch is transformed once and scored by every client model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from osfl.errors import ConfigError, DataError
from osfl.fl.method import PerClientPredictor

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform


@dataclass(frozen=True)
class EvalResult:
    """Accuracies in [0, 1].

    ``accuracy`` is the global test accuracy; for a ``PerClientPredictor`` it
    is the mean of the client models' accuracies (``mean_client_accuracy``,
    with the list in ``client_accuracies``). ``per_class_accuracy[c]`` is
    ``None`` for a class absent from the test set (averaged over clients for a
    ``PerClientPredictor``).
    """

    accuracy: float
    per_class_accuracy: tuple[float | None, ...]
    num_samples: int
    mean_client_accuracy: float | None = None
    client_accuracies: tuple[float, ...] | None = None
    nonfinite_outputs: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, with the accuracy clearly named ``global_test_accuracy``;
        non-finite scores become a warning (the images count as wrong)."""
        d: dict[str, Any] = {
            "global_test_accuracy": self.accuracy,
            "per_class_accuracy": list(self.per_class_accuracy),
            "num_samples": self.num_samples,
        }
        if self.client_accuracies is not None:
            d["mean_client_accuracy"] = self.mean_client_accuracy
            d["client_accuracies"] = list(self.client_accuracies)
        if self.nonfinite_outputs:
            d["nonfinite_outputs"] = self.nonfinite_outputs
            d["warnings"] = [
                f"the predictor gave non-finite scores (NaN/Inf) for {self.nonfinite_outputs} "
                f"test image(s); they count as wrong, not as class 0"
            ]
        return d


def _models_of(predictor: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    if isinstance(predictor, PerClientPredictor):
        return list(predictor.models)
    if isinstance(predictor, nn.ModuleList):
        return list(predictor)
    if isinstance(predictor, nn.Module):
        return [predictor]
    return list(predictor)


@torch.no_grad()
def correct_per_class(
    models: Sequence[nn.Module],
    test: ImageSet,
    transform: Transform | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(correct, total, nonfinite)``: correct predictions per (model, class),
    shape M×K (int64), test samples per class, shape K, and per model the
    number of images whose scores are not all finite (never counted correct:
    ``argmax`` of a NaN row would say class 0).

    Each model is put in eval mode for the pass and its previous mode restored.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if len(test) == 0:
        raise DataError("the test set is empty")
    device = torch.device(device)
    k = test.num_classes
    modes = [m.training for m in models]
    for m in models:
        m.to(device).eval()
    correct = torch.zeros(len(models), k, dtype=torch.int64, device=device)
    nonfinite = torch.zeros(len(models), dtype=torch.int64, device=device)
    try:
        for start in range(0, len(test), batch_size):
            xb = test.images[start : start + batch_size].to(device, non_blocking=True)
            yb = test.labels[start : start + batch_size].to(device, non_blocking=True)
            x = transform(xb) if transform is not None else xb.float() / 255
            for i, m in enumerate(models):
                scores = m(x)
                if scores.ndim != 2 or scores.shape[1] < k:
                    raise ConfigError(
                        f"predictor returned shape {tuple(scores.shape)}, expected (B, {k}) "
                        "class scores; build the model with num_classes of the test set"
                    )
                finite = torch.isfinite(scores).all(dim=1)
                hit = (scores.argmax(dim=1) == yb) & finite
                correct[i] += torch.bincount(yb[hit], minlength=k)
                nonfinite[i] += (~finite).sum()
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    total = torch.bincount(test.labels, minlength=k)
    return correct.cpu(), total, nonfinite.cpu()


def evaluate(
    predictor: nn.Module,
    test: ImageSet,
    transform: Transform | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> EvalResult:
    """Accuracy of ``predictor`` on ``test`` (see :class:`EvalResult`).

    ``transform`` is the deterministic eval pipeline (uint8 batch on
    ``device`` -> model input; ``None``: scale to [0, 1]). The predictor is
    moved to ``device``.
    """
    models = _models_of(predictor)
    if not models:
        raise ConfigError("nothing to evaluate: the predictor holds no models")
    correct, total, nonfinite = correct_per_class(models, test, transform, device, batch_size)
    n = int(total.sum())
    bad = int(nonfinite.sum())
    present = total > 0
    accs = (correct.sum(dim=1).double() / n).tolist()
    per_class = correct.double() / total.clamp(min=1).double()  # M×K
    mean_pc = per_class.mean(dim=0)
    per_class_list = tuple(
        float(mean_pc[c]) if bool(present[c]) else None for c in range(test.num_classes)
    )
    if isinstance(predictor, PerClientPredictor):
        mean = float(np.mean(accs))
        return EvalResult(mean, per_class_list, n, mean, tuple(accs), nonfinite_outputs=bad)
    return EvalResult(accs[0], per_class_list, n, nonfinite_outputs=bad)


def local_test_accuracy(
    predictors: nn.Module | Sequence[nn.Module],
    test: ImageSet,
    class_counts: np.ndarray | Sequence[Sequence[int]],
    transform: Transform | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> list[float]:
    """Each client's accuracy on ``test`` re-weighted by its training class proportions.

    ``class_counts`` is clients × classes (a Federation's class counts).
    ``predictors`` is one model per client (a ``PerClientPredictor`` or a
    list) or a single predictor used for every client (e.g. the global model).
    Client ``i`` scores ``sum_c p_ic * acc_c`` with ``p_ic`` its share of
    class ``c``, restricted to classes present in the test set and renormalised.
    """
    counts = np.asarray(class_counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[1] != test.num_classes:
        raise ConfigError(
            f"class_counts must be clients × {test.num_classes} classes, got shape {counts.shape}"
        )
    if (counts < 0).any():
        raise ConfigError("class_counts must be non-negative")
    models = _models_of(predictors)
    shared = isinstance(predictors, nn.Module) and not isinstance(
        predictors, PerClientPredictor | nn.ModuleList
    )
    if not shared and len(models) != counts.shape[0]:
        raise ConfigError(
            f"{len(models)} client models but class_counts has {counts.shape[0]} clients"
        )
    correct, total, _ = correct_per_class(models, test, transform, device, batch_size)
    present = (total > 0).numpy()
    acc = (correct.double() / total.clamp(min=1).double()).numpy()  # M×K
    out = []
    for i, row in enumerate(counts):
        w = row * present
        if w.sum() == 0:
            raise DataError(f"client {i} has no training samples of any class in the test set")
        out.append(float((w / w.sum()) @ acc[0 if shared else i]))
    return out


@dataclass(frozen=True)
class Evaluator:
    """A job's evaluator, built once from concrete parts (no config): a
    predictor's accuracy on ``test`` (global and per class), on
    ``validation`` when the run holds one out (``validation_accuracy``), and
    per client's label mix when ``local_counts`` (clients × classes) is given
    (``local_test_accuracies`` and their mean, ``local_test_accuracy``)."""

    test: ImageSet
    transform: Transform | None
    device: torch.device | str
    validation: ImageSet | None = None
    local_counts: np.ndarray | Sequence[Sequence[int]] | None = None

    def __call__(self, predictor: nn.Module) -> dict[str, Any]:
        res = evaluate(predictor, self.test, self.transform, self.device).as_dict()
        if self.validation is not None:
            res["validation_accuracy"] = evaluate(
                predictor, self.validation, self.transform, self.device
            ).accuracy
        if self.local_counts is not None:
            accs = local_test_accuracy(
                predictor, self.test, self.local_counts, self.transform, self.device
            )
            res["local_test_accuracies"] = accs
            res["local_test_accuracy"] = float(sum(accs) / len(accs))
        return res


def _unit(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0


def check_client_score(
    score: Any, num_classes: int, num_clients: int, client: int
) -> dict[str, Any]:
    """A client's score of its own model as a node sent it (an evaluator's
    metrics): accuracies in [0, 1], ``num_classes`` per-class entries (null for
    an absent class), ``num_clients`` local test accuracies where present.
    Anything else is a :class:`DataError` naming the client."""
    ok = (
        isinstance(score, dict)
        and _unit(score.get("global_test_accuracy"))
        and isinstance(score.get("per_class_accuracy"), list)
        and len(score["per_class_accuracy"]) == num_classes
        and all(v is None or _unit(v) for v in score["per_class_accuracy"])
        and ("validation_accuracy" not in score or _unit(score["validation_accuracy"]))
        and (
            "local_test_accuracies" not in score
            or (
                isinstance(score["local_test_accuracies"], list)
                and len(score["local_test_accuracies"]) == num_clients
                and all(_unit(v) for v in score["local_test_accuracies"])
            )
        )
    )
    if not ok:
        raise DataError(
            f"client {client} sent a malformed score of its own model ({str(score)[:120]})"
        )
    return score
