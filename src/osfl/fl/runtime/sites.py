"""Real sites: each client holds only its own data, the server holds none.

In a rehearsal every party builds the whole federation from one data set
(:class:`~osfl.fl.runtime.base.PartitionedData`). At real sites,

- a site's :class:`SiteData` is its own train set (and its own test set, for
  evaluating the final model locally), loaded from the path in its node
  config and mapped onto the class names the job agreed on
  (:func:`align_classes`: a folder whose name is not one of them is refused
  before training, naming it);
- the server's :class:`NoClientData` knows how many sites there are and,
  from the :class:`SiteRegistry` the operator gives it (run config
  ``site-registry``), which authenticated node plays which site and how many
  samples each declared at the start: a node claiming another site's
  partition id is refused, and ``meta.num_samples`` is bounded by the site's
  declared size (without a registry, by ``server.max_num_samples``, which
  also bounds every declared size: a registry cannot lift the server's
  limit). A rehearsal's server reads the registry too, for the node ids;
- without a server test set the sites evaluate the released final model on
  their own test sets and report counts (:class:`SiteScore`), which
  :func:`merge_site_scores` adds up into the federation's accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfl import jsonio
from osfl.data.classes import align_classes
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, DataError
from osfl.fl.evaluate import correct_per_class

__all__ = [
    "NoClientData",
    "Site",
    "SiteData",
    "SiteRegistry",
    "SiteScore",
    "align_classes",
    "merge_site_scores",
    "score_at_site",
]


@dataclass(frozen=True)
class Site:
    """One site as the federation agreed at the start: the client id it plays
    (``partition-id``), the node id the SuperLink gave its public key when it
    was registered (``flwr supernode register KEY``: with node authentication
    only the holder of that key is that node), and the samples it declared."""

    partition_id: int
    node_id: int
    num_samples: int


def _int(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{where}: {key!r} must be an integer >= 0, got {value!r}")
    return value


class SiteRegistry:
    """Which authenticated node plays which site, and each site's declared
    size: a site's identity is its key, not the ``partition-id`` it claims."""

    def __init__(self, sites: Sequence[Site]):
        self.by_client = {s.partition_id: s for s in sites}
        nodes = [s.node_id for s in sites]
        if len(self.by_client) != len(sites) or len(set(nodes)) != len(nodes):
            raise DataError("site registry: a partition id or a node id is listed twice")
        for s in sites:
            if s.num_samples < 1:
                raise DataError(f"site registry: site {s.partition_id} declares no samples")

    @classmethod
    def from_file(cls, path: str | Path) -> SiteRegistry:
        """``{"sites": [{"partition-id": 0, "node-id": 7765, "num-samples": 540}, ...]}``."""
        try:
            doc = jsonio.loads(Path(path).read_text(), max_depth=4)
        except (OSError, ValueError) as e:
            raise DataError(f"site registry {path}: unreadable ({e})") from e
        entries = doc.get("sites") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise DataError(f"site registry {path}: no list of sites under 'sites'")
        where = f"site registry {path}"
        return cls(
            [
                Site(
                    _int(e, "partition-id", where),
                    _int(e, "node-id", where),
                    _int(e, "num-samples", where),
                )
                for e in entries
            ]
        )

    def check(self, num_clients: int, max_num_samples: int | None = None) -> None:
        """Every site of the federation is registered, and no other; no site
        declares more than ``max_num_samples`` (``server.max_num_samples``:
        the operator's file must not lift the server's own bound)."""
        want = set(range(num_clients))
        if set(self.by_client) != want:
            listed = sorted(self.by_client)
            shown = f"{listed[:8]}{' ...' if len(listed) > 8 else ''}"
            raise ConfigError(
                f"the site registry lists partition ids {shown}; the run has "
                f"{num_clients} sites (0..{num_clients - 1}): register each site once"
            )
        if max_num_samples is None:
            return
        over = [s for _, s in sorted(self.by_client.items()) if s.num_samples > max_num_samples]
        if over:
            raise ConfigError(
                f"the site registry declares {over[0].num_samples} samples for site "
                f"{over[0].partition_id}, more than server.max_num_samples={max_num_samples}: "
                "correct the registry, or raise server.max_num_samples"
            )

    def node_ids(self) -> dict[int, int]:
        """Partition id -> the node registered to play it."""
        return {c: s.node_id for c, s in self.by_client.items()}


class NoClientData:
    """The server's view of the sites: their number, not their data, and (with
    a registry) which node plays each and how many samples it declared."""

    holds_data = False

    def __init__(
        self,
        num_clients: int,
        registry: SiteRegistry | None = None,
        max_num_samples: int | None = None,
    ):
        if num_clients < 1:
            raise ConfigError(f"a federation needs at least one site, got {num_clients}")
        if registry is not None:
            registry.check(num_clients, max_num_samples)
        self.num_clients, self.registry = num_clients, registry

    def size(self, client: int) -> int | None:
        site = self.registry.by_client.get(client) if self.registry is not None else None
        return None if site is None else site.num_samples

    def node_id(self, client: int) -> int | None:
        site = self.registry.by_client.get(client) if self.registry is not None else None
        return None if site is None else site.node_id

    def data(self, client: int) -> ImageSet:
        raise ConfigError(
            f"the server holds no data of site {client}: methods run their client side at the sites"
        )


class SiteData:
    """One site's own data (``client`` is its id among ``num_clients``)."""

    holds_data = False  # its own only

    def __init__(self, client: int, num_clients: int, train: ImageSet, test: ImageSet | None):
        if not 0 <= client < num_clients:
            raise ConfigError(
                f"partition-id {client} is outside the federation of {num_clients} sites "
                f"(valid: 0..{num_clients - 1})"
            )
        self.client, self.num_clients, self.train, self.test = client, num_clients, train, test

    def size(self, client: int) -> int | None:
        return len(self.train) if client == self.client else None

    def node_id(self, client: int) -> int | None:
        return None  # a site does not check the others' identities

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
