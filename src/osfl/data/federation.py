"""The Federation contract (docs/design.md §2): which train samples each client holds.

A :class:`Federation` is the output of :func:`osfl.data.partition.make_federation`:
one sorted int64 index array per client into a train ImageSet, the scheme, its
resolved parameters and the seed that made them, and per-client class counts
(the statistics the heat map of FedMITR's Fig. 3 and the privacy audits need).

It is stored as plain JSON (never pickle) so that a split can be read, diffed and
shared; :meth:`Federation.load_json` checks everything it reads (indices in range
and disjoint, counts consistent, the stored key matching the content) because a
federation file is user input. The key covers the content (every client's
indices and class counts) as well as the recipe that drew it, so an edited
file (an index moved between two clients) no longer matches its key, and two
runs whose records hold one key trained on the same clients (issue 51;
format 2: a format-1 file's key hashed the recipe alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osfl.errors import DataError
from osfl.safe_read import read_json

FORMAT = "osfl.federation"
FORMAT_VERSION = 2


def as_label_array(
    labels: np.ndarray | torch.Tensor | Sequence[int], what: str = "labels"
) -> np.ndarray:
    """``labels`` (or domains) as a 1-D non-negative int64 numpy array, refusing anything else."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise DataError(f"{what} must be 1-D (one per sample), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise DataError(f"{what} must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise DataError(f"{what} must be >= 0, got a minimum of {int(arr.min())}")
    return arr


def fingerprint_labels(labels: np.ndarray, domains: np.ndarray | None = None) -> str:
    """A content hash of the labels (and domains, where a scheme reads them).

    Part of :meth:`Federation.key`: the same scheme and seed on other labels is a
    different federation and must not be served from the cache.
    """
    h = hashlib.sha256()
    h.update(f"n={labels.shape[0]}".encode())
    h.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    if domains is not None:
        h.update(b"domains")
        h.update(np.ascontiguousarray(domains, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def federation_key(
    scheme: str,
    params: Mapping[str, Any],
    seed: int,
    num_clients: int,
    num_classes: int,
    num_samples: int,
    data_fingerprint: str,
) -> str:
    """The stable hash behind :meth:`Federation.key` (computable before partitioning,
    which is what lets the cache skip the work)."""
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "scheme": scheme,
        "params": dict(sorted(params.items())),
        "seed": int(seed),
        "num_clients": int(num_clients),
        "num_classes": int(num_classes),
        "num_samples": int(num_samples),
        "data": data_fingerprint,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def content_key(recipe_key: str, client_indices: Sequence[np.ndarray], counts: np.ndarray) -> str:
    """:meth:`Federation.key`: the recipe's key with every client's indices
    and class counts hashed in (one client's array after another, each with
    its length, so that moving an index between clients changes it)."""
    h = hashlib.sha256(recipe_key.encode())
    for a in client_indices:
        h.update(f"|{a.shape[0]}|".encode())
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(counts, dtype=np.int64).tobytes())
    return h.hexdigest()[:24]


@dataclass(frozen=True, eq=False)
class Federation:
    """Per-client index sets into a train set, with the recipe that made them.

    ``client_indices[c]`` is client ``c``'s sorted, duplicate-free int64 index
    array; no index belongs to two clients. ``class_counts[c, k]`` is the number
    of client ``c``'s samples of class ``k`` (derived from the labels when the
    federation was made, and checked against the sizes here).
    """

    scheme: str
    params: Mapping[str, Any]
    seed: int
    num_clients: int
    num_classes: int
    num_samples: int
    data_fingerprint: str
    client_indices: tuple[np.ndarray, ...]
    class_counts: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        idx = tuple(np.asarray(a, dtype=np.int64) for a in self.client_indices)
        counts = np.asarray(self.class_counts, dtype=np.int64)
        object.__setattr__(self, "client_indices", idx)
        object.__setattr__(self, "class_counts", counts)
        object.__setattr__(self, "params", dict(self.params))
        _check_consistent(self)
        for a in idx:
            a.setflags(write=False)
        counts.setflags(write=False)

    @classmethod
    def from_indices(
        cls,
        labels: np.ndarray,
        client_indices: Sequence[np.ndarray],
        *,
        scheme: str,
        params: Mapping[str, Any],
        seed: int,
        num_classes: int,
        data_fingerprint: str,
    ) -> Federation:
        """Build from raw per-client indices: sorts them and counts classes."""
        idx = tuple(np.sort(np.asarray(a, dtype=np.int64)) for a in client_indices)
        counts = np.zeros((len(idx), num_classes), dtype=np.int64)
        for c, a in enumerate(idx):
            counts[c] = np.bincount(labels[a], minlength=num_classes)
        return cls(
            scheme=scheme,
            params=params,
            seed=seed,
            num_clients=len(idx),
            num_classes=num_classes,
            num_samples=int(labels.shape[0]),
            data_fingerprint=data_fingerprint,
            client_indices=idx,
            class_counts=counts,
        )

    # ---- statistics -------------------------------------------------------------
    @property
    def sizes(self) -> np.ndarray:
        """Samples per client (int64, length ``num_clients``)."""
        return np.array([a.shape[0] for a in self.client_indices], dtype=np.int64)

    def classes_per_client(self, min_count: int = 1) -> np.ndarray:
        """How many classes each client holds at least ``min_count`` samples of."""
        return (self.class_counts >= min_count).sum(axis=1)

    def key(self) -> str:
        """Stable hash of the recipe (:meth:`recipe_key`) and the content: every
        client's indices and class counts."""
        return content_key(self.recipe_key(), self.client_indices, self.class_counts)

    def recipe_key(self) -> str:
        """Stable hash of (scheme, params, seed, num_clients, num_classes, N,
        labels): what the cache is looked up by before anything is drawn."""
        return federation_key(
            self.scheme,
            self.params,
            self.seed,
            self.num_clients,
            self.num_classes,
            self.num_samples,
            self.data_fingerprint,
        )

    def check_labels(self, labels: np.ndarray | torch.Tensor, domains: Any = None) -> None:
        """Refuse to apply this federation to labels other than those it was made from."""
        lab = as_label_array(labels)
        dom = None if domains is None else as_label_array(domains, "domains")
        if fingerprint_labels(lab, dom) != self.data_fingerprint:
            raise DataError(
                f"this federation ({self.scheme}, seed {self.seed}) was made for other labels "
                f"({self.num_samples} samples, fingerprint {self.data_fingerprint}); "
                "re-run make_federation on this train set"
            )

    def summary(self) -> dict[str, Any]:
        """Sizes and classes per client, as JSON-able numbers (for logs and run summaries)."""
        sizes = self.sizes
        used = int(sizes.sum())
        return {
            "scheme": self.scheme,
            "params": dict(self.params),
            "seed": self.seed,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "num_samples": self.num_samples,
            "assigned_samples": used,
            "sizes": sizes.tolist(),
            "size_min": int(sizes.min()) if sizes.size else 0,
            "size_mean": float(sizes.mean()) if sizes.size else 0.0,
            "size_max": int(sizes.max()) if sizes.size else 0,
            "classes_per_client": self.classes_per_client().tolist(),
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Federation):
            return NotImplemented
        return (
            self.scheme == other.scheme
            and dict(self.params) == dict(other.params)
            and self.seed == other.seed
            and self.num_clients == other.num_clients
            and self.num_classes == other.num_classes
            and self.num_samples == other.num_samples
            and self.data_fingerprint == other.data_fingerprint
            and all(
                np.array_equal(a, b)
                for a, b in zip(self.client_indices, other.client_indices, strict=True)
            )
            and np.array_equal(self.class_counts, other.class_counts)
        )

    def __hash__(self) -> int:
        return hash(self.key())

    # ---- JSON -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "key": self.key(),
            "scheme": self.scheme,
            "params": dict(self.params),
            "seed": self.seed,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "num_samples": self.num_samples,
            "data_fingerprint": self.data_fingerprint,
            "client_indices": [a.tolist() for a in self.client_indices],
            "class_counts": self.class_counts.tolist(),
        }

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (temp file + rename), so a crash never leaves half a cache entry."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f, separators=(",", ":"))
            # mkstemp makes the file private (0600); a federation file is meant to be
            # shared, so give it the permissions any new file of the user gets
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def from_dict(cls, d: Any, source: str = "federation") -> Federation:
        """Validate a parsed JSON object and build the Federation; DataError if malformed."""

        def bad(msg: str) -> DataError:
            return DataError(f"{source}: {msg}; re-create it with make_federation")

        _check_fields(d, bad)
        idx = _client_indices(d["client_indices"], bad)
        counts_arr = _class_counts(d["class_counts"], bad)
        try:
            fed = cls(
                scheme=d["scheme"],
                params=d["params"],
                seed=d["seed"],
                num_clients=d["num_clients"],
                num_classes=d["num_classes"],
                num_samples=d["num_samples"],
                data_fingerprint=d["data_fingerprint"],
                client_indices=tuple(idx),
                class_counts=counts_arr,
            )
        except DataError as e:
            raise bad(str(e)) from None
        if fed.key() != d["key"]:
            raise bad("stored key does not match its content (edited or corrupted)")
        return fed

    @classmethod
    def load_json(cls, path: str | os.PathLike[str]) -> Federation:
        """Read a file written by :meth:`save_json`, validating every field
        (read through :mod:`osfl.safe_read`: a regular UTF-8 file of at most
        :data:`MAX_FILE_BYTES`, JSON nested at most a few levels)."""
        d = read_json(path, max_bytes=MAX_FILE_BYTES, max_depth=4, what="federation file")
        return cls.from_dict(d, source=str(path))


#: The largest federation file read: 256 MiB holds the indices of about 30
#: million samples (ImageNet-1k's train set is 1.3 million).
MAX_FILE_BYTES = 256 << 20


#: The fields of a federation file and their JSON types.
_FIELDS: dict[str, type] = {
    "scheme": str,
    "params": dict,
    "seed": int,
    "num_clients": int,
    "num_classes": int,
    "num_samples": int,
    "data_fingerprint": str,
    "client_indices": list,
    "class_counts": list,
    "key": str,
}


def _is_int(x: Any) -> bool:
    """A JSON integer (``true`` is a bool to JSON, not 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _check_fields(d: Any, bad: Callable[[str], DataError]) -> None:
    """The file is this format's, every field present with its JSON type, the
    integers small enough for int64 arithmetic."""
    if not isinstance(d, dict):
        raise bad("not a JSON object")
    if d.get("format") == FORMAT and d.get("version") == 1:
        raise bad("written by an older osfl (format 1, whose key does not cover the indices)")
    if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
        raise bad(f"not an {FORMAT} v{FORMAT_VERSION} file")
    for name, typ in _FIELDS.items():
        v = d.get(name)
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise bad(f"field {name!r} missing or not a {typ.__name__}")
    if any(
        not -(2**62) < d[f] < 2**62 for f in ("seed", "num_clients", "num_classes", "num_samples")
    ):
        raise bad("an integer field is out of range")


def _client_indices(rows: list[Any], bad: Callable[[str], DataError]) -> list[np.ndarray]:
    """Each client's index list as int64 (their ranges and disjointness are
    checked by :func:`_check_consistent`)."""
    idx = []
    for c, a in enumerate(rows):
        if not isinstance(a, list) or not all(_is_int(i) for i in a):
            raise bad(f"client_indices[{c}] is not a list of integers")
        try:
            idx.append(np.array(a, dtype=np.int64))
        except OverflowError:
            raise bad(f"client_indices[{c}] holds an out-of-range integer") from None
    return idx


def _class_counts(counts: list[Any], bad: Callable[[str], DataError]) -> np.ndarray:
    """The (clients, classes) count matrix as int64: rectangular, non-empty."""
    rows_ok = all(isinstance(r, list) and all(_is_int(x) for x in r) for r in counts)
    if not rows_ok or len({len(r) for r in counts}) > 1:
        raise bad("class_counts is not a rectangular list of integers")
    if not counts:
        raise bad("class_counts is empty (a federation has at least one client)")
    try:
        return np.array(counts, dtype=np.int64)
    except OverflowError:
        raise bad("class_counts holds an out-of-range integer") from None


def _check_consistent(fed: Federation) -> None:
    """The invariants every Federation satisfies, whoever built it."""
    _check_shapes(fed)
    for c, a in enumerate(fed.client_indices):
        _check_client_indices(c, a, fed.num_samples)
    _check_disjoint(fed)
    for c, a in enumerate(fed.client_indices):
        if int(fed.class_counts[c].sum()) != a.shape[0]:
            raise DataError(
                f"client {c}: class counts sum to {int(fed.class_counts[c].sum())} "
                f"but it holds {a.shape[0]} samples"
            )


def _check_shapes(fed: Federation) -> None:
    """One index array per client, at least one class, and a non-negative
    count matrix of (clients, classes)."""
    if fed.num_clients < 1 or len(fed.client_indices) != fed.num_clients:
        raise DataError(f"num_clients={fed.num_clients} but {len(fed.client_indices)} index arrays")
    if fed.num_classes < 1:
        raise DataError(f"num_classes must be >= 1, got {fed.num_classes}")
    if fed.class_counts.shape != (fed.num_clients, fed.num_classes):
        raise DataError(
            f"class_counts has shape {fed.class_counts.shape}, expected "
            f"({fed.num_clients}, {fed.num_classes})"
        )
    if fed.class_counts.size and fed.class_counts.min() < 0:
        raise DataError("class_counts must be >= 0")


def _check_client_indices(c: int, a: np.ndarray, num_samples: int) -> None:
    """Client ``c``'s indices: 1-D, inside the dataset, strictly increasing
    (sorted, no duplicate), which :func:`_check_disjoint` relies on."""
    if a.ndim != 1:
        raise DataError(f"client {c}: indices must be 1-D")
    if a.size:
        if a.min() < 0 or a.max() >= num_samples:
            raise DataError(f"client {c}: indices outside [0, {num_samples})")
        if np.any(np.diff(a) <= 0):
            raise DataError(f"client {c}: indices must be sorted and without duplicates")


def _check_disjoint(fed: Federation) -> None:
    """No sample held by two clients, found by sorting (memory ~ assigned
    samples, not ``num_samples``, which a file could set to anything)."""
    every = np.concatenate(fed.client_indices)
    owner = np.repeat(np.arange(fed.num_clients), [a.shape[0] for a in fed.client_indices])
    order = np.argsort(every, kind="stable")
    dup = np.flatnonzero(np.diff(every[order]) == 0)
    if dup.size:
        c = int(owner[order[dup[0] + 1]])
        raise DataError(f"client {c}: holds samples that another client also holds")
