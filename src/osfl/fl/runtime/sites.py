"""Real sites: each client holds only its own data, the server holds none.

In a rehearsal every party builds the whole federation from one data set
(:class:`~osfl.fl.runtime.base.PartitionedData`). At real sites,

- a site's :class:`SiteData` is its own train set (and its own test set, for
  evaluating the final model locally), loaded from the path in its node
  config and mapped onto the class names the job agreed on
  (:func:`align_classes`: a folder whose name is not one of them is refused
  before training, naming it);
- the server's :class:`NoClientData` knows how many sites there are and
  nothing else, so ``meta.num_samples`` is bounded by
  ``server.max_num_samples`` rather than by a partition size it cannot know;
- without a server test set the sites evaluate the released final model on
  their own test sets and report counts (:class:`SiteScore`), which
  :func:`merge_site_scores` adds up into the federation's accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from osfl.data.classes import align_classes
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, DataError
from osfl.fl.evaluate import correct_per_class

__all__ = [
    "NoClientData",
    "SiteData",
    "SiteScore",
    "align_classes",
    "merge_site_scores",
    "score_at_site",
]


class NoClientData:
    """The server's view of the sites: their number, not their data."""

    def __init__(self, num_clients: int):
        if num_clients < 1:
            raise ConfigError(f"a federation needs at least one site, got {num_clients}")
        self.num_clients = num_clients

    def size(self, client: int) -> int | None:
        return None

    def data(self, client: int) -> ImageSet:
        raise ConfigError(
            f"the server holds no data of site {client}: methods run their client side at the sites"
        )


class SiteData:
    """One site's own data (``client`` is its id among ``num_clients``)."""

    def __init__(self, client: int, num_clients: int, train: ImageSet, test: ImageSet | None):
        if not 0 <= client < num_clients:
            raise ConfigError(
                f"partition-id {client} is outside the federation of {num_clients} sites "
                f"(valid: 0..{num_clients - 1})"
            )
        self.client, self.num_clients, self.train, self.test = client, num_clients, train, test

    def size(self, client: int) -> int | None:
        return len(self.train) if client == self.client else None

    def data(self, client: int) -> ImageSet:
        if client != self.client:
            raise ConfigError(f"this site is client {self.client}, not client {client}")
        return self.train


@dataclass(frozen=True)
class SiteScore:
    """A site's evaluation of the released model: correct predictions and
    images per class, and images with non-finite scores (counted wrong)."""

    correct: tuple[int, ...]
    total: tuple[int, ...]
    nonfinite: int = 0

    def as_meta(self) -> dict[str, Any]:
        return {
            "correct": list(self.correct),
            "total": list(self.total),
            "nonfinite": self.nonfinite,
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], num_classes: int, client: int) -> SiteScore:
        """A site's reply, checked: lists of ``num_classes`` non-negative
        integers with correct <= total."""
        correct, total, bad = meta.get("correct"), meta.get("total"), meta.get("nonfinite", 0)
        ok = (
            isinstance(correct, list)
            and isinstance(total, list)
            and len(correct) == len(total) == num_classes
            and all(isinstance(v, int) and not isinstance(v, bool) for v in [*correct, *total, bad])
            and all(0 <= c <= t for c, t in zip(correct, total, strict=True))
            and 0 <= bad <= sum(total)
        )
        if not ok:
            raise DataError(f"site {client} sent a malformed evaluation ({str(meta)[:120]})")
        return cls(tuple(correct), tuple(total), int(bad))


def score_at_site(predictor: Any, test: ImageSet, transform: Any, device: Any) -> SiteScore:
    """A site's counts for the released model on its own test set."""
    correct, total, nonfinite = correct_per_class([predictor], test, transform, device)
    return SiteScore(
        tuple(int(v) for v in correct[0]), tuple(int(v) for v in total), int(nonfinite[0])
    )


def merge_site_scores(scores: Mapping[int, SiteScore], num_classes: int) -> dict[str, Any]:
    """The federation's metrics from the sites' counts: accuracy over every
    site's test images, per-class accuracy, and each site's own accuracy."""
    correct = [sum(s.correct[k] for s in scores.values()) for k in range(num_classes)]
    total = [sum(s.total[k] for s in scores.values()) for k in range(num_classes)]
    n = sum(total)
    if n == 0:
        raise DataError("no site had test images to evaluate the final model on")
    out: dict[str, Any] = {
        "global_test_accuracy": sum(correct) / n,
        "per_class_accuracy": [c / t if t else None for c, t in zip(correct, total, strict=True)],
        "num_samples": n,
        "site_accuracies": {
            str(c): (sum(s.correct) / sum(s.total) if sum(s.total) else None)
            for c, s in sorted(scores.items())
        },
        "evaluated_at": "sites",
    }
    bad = sum(s.nonfinite for s in scores.values())
    if bad:
        out["nonfinite_outputs"] = bad
        out["warnings"] = [
            f"the predictor gave non-finite scores for {bad} site test image(s); counted wrong"
        ]
    return out
