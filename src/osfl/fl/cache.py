"""Content-keyed cache of locally trained client models (docs/design.md §2, §7).

Local training is the expensive part of one-shot FL that every method shares:
one-shot FedAvg, Ensemble, FedDF [Lin et al., NeurIPS 2020], DENSE [Zhang et
al., NeurIPS 2022], Co-Boosting [Dai et al., ICLR 2024], DeepInversion/ADI
[Yin et al., CVPR 2020] and FedMITR all start from the same trained clients.
Keying the trained weights by the *content* of what determines them (data
fingerprint, model spec, training config, seed, client id, objective) lets a
comparison of ten methods train each client once.

Storage: ``<root>/<key>.safetensors`` (the state dict; never pickle) next to
``<root>/<key>.json`` (the key's parts, human-readable, plus metadata such as
the training loss). Both are written to a temporary file and moved into place
with ``os.replace``, so a crash or a concurrent writer never leaves a
half-written entry; the weights file is written last and is what marks an
entry as present. The sidecar keeps the sha256 of the weights (and aux) file,
checked on every read: a file that changed since it was written (a bit flip,
a hand edit, negated weights that still parse), that does not parse, or whose
tensors do not fit the model asking for it is a logged warning and a miss, so
the client is retrained and the entry overwritten, never used silently.

:func:`osfl.fl.client_training.train_client` is the cached path every method
uses to train a client; this module is only the storage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from osfl import jsonio
from osfl.data.transforms import Transform
from osfl.errors import ConfigError
from osfl.interrupts import atomic_section

__all__ = ["CACHE_FORMAT", "ClientCache", "canonical_json", "state_hash", "transform_key"]

log = logging.getLogger(__name__)

#: Bumped when the meaning of a cached entry changes, so old entries stop matching
#: (2: the sidecar carries the sha256 of the files it describes).
CACHE_FORMAT = 2


def canonical_json(parts: Mapping[str, Any]) -> str:
    """Sorted-key, compact JSON: equal parts give equal strings, hence equal keys."""
    try:
        return json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cache key parts must be JSON-serialisable: {e}") from e


def state_hash(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 of a state dict's names, dtypes, shapes and bytes (initial weights in keys)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        # view as bytes so that every dtype (bf16 included) hashes without numpy support
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def _cpu_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # clone: safetensors refuses tensors sharing storage (tied weights, views)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def _is_key(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class ClientCache:
    """Trained client weights keyed by content, stored as safetensors + JSON.

    ``hits`` / ``misses`` count lookups through :meth:`get_or_train` (and
    :meth:`get`), so a run can report how much training it saved.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()  # clients may train in parallel threads

    # --- keys ------------------------------------------------------------
    @staticmethod
    def key(**parts: Any) -> str:
        """sha256 of the canonical JSON of ``parts`` (plus the cache format)."""
        payload = canonical_json({"format": CACHE_FORMAT, "parts": parts})
        return hashlib.sha256(payload.encode()).hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        if not _is_key(key):
            raise ConfigError(f"not a cache key (expected 64 lowercase hex digits): {key!r}")
        return self.root / f"{key}.safetensors", self.root / f"{key}.json"

    # --- storage ---------------------------------------------------------
    def get(
        self, key: str, like: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """The stored state dict, or ``None``: a miss when the entry is absent,
        unreadable, not the bytes its sidecar's sha256 names, or (``like``:
        the state dict of the model that will load it) has other names,
        shapes or dtypes. Every miss but an absent entry is logged as a warning."""
        weights, _ = self._paths(key)
        state = self._read(key, weights, "weights") if weights.exists() else None
        if state is not None and like is not None:
            why = _mismatch(state, like)
            if why is not None:
                log.warning("cache entry %s does not fit the model (%s); retraining", key[:12], why)
                state = None
        with self._lock:
            if state is None:
                self.misses += 1
            else:
                self.hits += 1
        return state

    def _read(self, key: str, path: Path, role: str) -> dict[str, torch.Tensor] | None:
        """The tensors of ``path`` if its bytes are the ones the sidecar names."""
        try:
            blob = path.read_bytes()
            want = ((self.meta(key) or {}).get("sha256") or {}).get(role)
            if want != hashlib.sha256(blob).hexdigest():
                why = "no sha256 in its sidecar" if want is None else "sha256 mismatch"
                raise ValueError(f"{path.name}: {why}, the file changed after it was written")
            return load(blob)
        except (SafetensorError, OSError, ValueError, AttributeError) as e:
            log.warning("cache entry %s is unusable (%s); treating it as a miss", key[:12], e)
            return None

    def meta(self, key: str) -> dict[str, Any] | None:
        """The JSON sidecar of an entry (its key parts and metadata), if present
        and readable."""
        _, sidecar = self._paths(key)
        try:
            meta = jsonio.loads(sidecar.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("cache entry %s: unreadable sidecar (%s)", key[:12], e)
            return None
        return meta if isinstance(meta, dict) else None

    def put(
        self,
        key: str,
        state_dict: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any] | None = None,
        aux: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Store ``state_dict`` (moved to CPU, de-aliased) and a JSON sidecar
        with the files' sha256, atomically (sidecar, then aux, then weights).

        ``aux``: tensors that belong to the entry but not to the model (e.g. the
        labels of every local step, the ground truth of privacy audits), kept in
        ``<key>.aux.safetensors`` and read back with :meth:`aux`.
        """
        weights, sidecar = self._paths(key)
        blobs = {"weights": save(_cpu_copies(state_dict))}
        if aux:
            blobs["aux"] = save(_cpu_copies(aux))
        sums = {role: hashlib.sha256(b).hexdigest() for role, b in blobs.items()}
        text = json.dumps(
            {**dict(meta or {}), "sha256": sums}, sort_keys=True, indent=2, default=str
        )
        self._atomic_write(sidecar, lambda p: Path(p).write_text(text))
        if aux:
            self._atomic_write(self._aux_path(key), lambda p: Path(p).write_bytes(blobs["aux"]))
        else:  # re-putting an entry must not leave a stale aux file behind
            self._aux_path(key).unlink(missing_ok=True)
        self._atomic_write(weights, lambda p: Path(p).write_bytes(blobs["weights"]))

    def _aux_path(self, key: str) -> Path:
        return self._paths(key)[0].with_suffix(".aux.safetensors")

    def aux(self, key: str) -> dict[str, torch.Tensor] | None:
        """The entry's auxiliary tensors (see :meth:`put`), if any and intact."""
        path = self._aux_path(key)
        return self._read(key, path, "aux") if path.exists() else None

    def _atomic_write(self, dest: Path, write: Callable[[str], object]) -> None:
        with atomic_section():  # a second Ctrl-C exits after the rename, not mid-file
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{dest.name}.", suffix=".tmp")
            os.close(fd)
            try:
                write(tmp)
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def get_or_train(
        self,
        parts: Mapping[str, Any],
        train: Callable[[], Mapping[str, torch.Tensor]],
        like: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """``(state_dict, hit)``: the cached weights for ``parts``, or ``train()``'s, stored.

        ``train`` runs only on a miss; its state dict is stored with ``parts``
        in the sidecar so that ``ls`` + ``cat`` tell what each entry is.
        """
        key = self.key(**parts)
        state = self.get(key, like)
        if state is not None:
            log.debug("client cache hit %s", key[:12])
            return state, True
        log.debug("client cache miss %s: training", key[:12])
        trained = dict(train())
        self.put(key, trained, {"parts": dict(parts)})
        return trained, False

    def clear(self) -> int:
        """Delete every entry (and stray temporary files); returns how many entries went."""
        n = 0
        for path in self.root.iterdir():
            # only files this cache wrote: "<64 hex>.safetensors|json" and ".<that>.*.tmp"
            name = path.name.lstrip(".")
            stem, _, rest = name.partition(".")
            if not _is_key(stem) or rest.split(".")[0] not in ("safetensors", "json", "aux"):
                continue
            if rest == "safetensors":  # the weights file: one per entry
                n += 1
            path.unlink(missing_ok=True)
        self.hits = self.misses = 0
        return n

    def __len__(self) -> int:
        return sum(1 for p in self.root.glob("*.safetensors") if _is_key(p.stem))

    def __repr__(self) -> str:
        return f"ClientCache({str(self.root)!r}, entries={len(self)}, hits={self.hits}, misses={self.misses})"


def _mismatch(state: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``state`` cannot be loaded where ``like`` is expected (``None``: it can)."""
    if set(state) != set(like):
        odd = sorted(set(state) ^ set(like))
        return f"tensor names differ, e.g. {odd[0]!r}"
    for name, want in like.items():
        got = state[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            return (
                f"{name}: {got.dtype}{tuple(got.shape)}, expected {want.dtype}{tuple(want.shape)}"
            )
    return None


def transform_key(transform: object | None) -> Any:
    """A JSON-able identity of a transform for cache keys: an osfl
    :class:`~osfl.data.transforms.Transform`'s ``key()``, else (any other
    callable) its class and ``repr``, memory addresses stripped, so two equal
    pipelines give equal keys."""
    if transform is None:
        return None
    if isinstance(transform, Transform):
        return transform.key()
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(transform))
    return f"{type(transform).__module__}.{type(transform).__qualname__}:{text}"
