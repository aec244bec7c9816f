"""What an honest-but-curious server sees of one client in one round (docs/design.md §2).

Privacy attacks consume plain, documented data rather than the simulator, as
in breaching's ``base_attack`` [Geiping et al., "Inverting Gradients", NeurIPS
2020]: the broadcast the client received, its upload, and the public training
hyper-parameters (lr, batch size, local steps/epochs, optimizer, momentum, FL
scheme) that RLU [Chen & Vikalo, "Recovering Labels from Local Updates in
Federated Learning", ICML 2024, §3: "the HBC server knows the batch size,
number of local epochs and learning rate"] and LLG+/ZLG+/iRLG assume. In simulation the ground truth (the labels each local step
used, ``num_classes``) is attached in ``truth`` so audits score themselves.
What else the server knows of the client — a stateful scheme's history
(SCAFFOLD's control variates, FedDyn's gradient state, FedDC's drift: RLU's
``h`` term, Chen & Vikalo Table 1) — goes in ``history``, never mixed into
the broadcast or the upload. :func:`observe` is the one way to build one.

On disk an Observation is a directory: ``observation.json`` (ids, upload
metadata, hyper-parameters, the non-tensor truth), ``upload.safetensors``,
``history.safetensors`` (if any), ``truth.safetensors`` (tensor truth, if
any) and the broadcast, either
``broadcast.safetensors`` or a relative path to a file shared by all clients
of the round. No pickle anywhere, so ``osfl audit RUN_DIR`` can read
directories from anyone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from osfl import jsonio
from osfl.errors import DataError

_JSON = "observation.json"
_UPLOAD = "upload.safetensors"
_TRUTH = "truth.safetensors"
_HISTORY = "history.safetensors"
_BROADCAST = "broadcast.safetensors"
HISTORY_PREFIX = "history."


def save_tensors(tensors: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """safetensors file of CPU, contiguous, de-aliased copies (tied weights allowed)."""
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(path))


@dataclass(frozen=True, eq=False)
class Observation:
    """One client's message exchange in one round, as the server saw it.

    ``truth`` is ``None`` outside simulation; in simulation it may hold
    ``labels`` (int64, the labels each local step used, concatenated in step
    order) and ``num_classes``, plus anything else an audit scores against.
    ``history``: ``history.<scheme>.<name>.<param>`` tensors the server knows
    of this client at the start of the round (empty for stateless methods).
    """

    client_id: int
    round: int
    broadcast: dict[str, torch.Tensor] = field(default_factory=dict)
    upload: dict[str, torch.Tensor] = field(default_factory=dict)
    upload_meta: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    truth: dict[str, Any] | None = None
    history: dict[str, torch.Tensor] = field(default_factory=dict)

    def save(self, dir: str | Path, *, broadcast_path: str | Path | None = None) -> Path:
        """Write this observation into ``dir`` (created); returns ``dir``.

        ``broadcast_path``: an already-written broadcast file to reference
        instead of writing a copy (a round's broadcast is shared by its
        clients); it must lie in ``dir`` or its parent directory.
        """
        out = Path(dir)
        out.mkdir(parents=True, exist_ok=True)
        save_tensors(self.upload, out / _UPLOAD)
        if self.history:
            save_tensors(self.history, out / _HISTORY)
        if broadcast_path is None:
            save_tensors(self.broadcast, out / _BROADCAST)
            bref = _BROADCAST
        else:
            shared = Path(broadcast_path).resolve()
            if not shared.is_relative_to(out.resolve().parent):
                raise DataError(
                    f"shared broadcast {shared} must lie in {out} or its parent directory"
                )
            bref = Path(os.path.relpath(shared, out.resolve())).as_posix()
        truth_json: dict[str, Any] | None = None
        if self.truth is not None:
            tensors = {k: v for k, v in self.truth.items() if isinstance(v, torch.Tensor)}
            truth_json = {k: v for k, v in self.truth.items() if k not in tensors}
            if tensors:
                save_tensors(tensors, out / _TRUTH)
        doc = {
            "client_id": self.client_id,
            "round": self.round,
            "broadcast": bref,
            "upload_meta": self.upload_meta,
            "hparams": self.hparams,
            "truth": truth_json,
        }
        try:
            text = json.dumps(doc, indent=2, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise DataError(f"observation of client {self.client_id} is not JSON-able: {e}") from e
        (out / _JSON).write_text(text)
        return out

    @classmethod
    def load(cls, dir: str | Path) -> Observation:
        """Read an observation written by :meth:`save` (safetensors + JSON only).

        The directory may come from anyone (``osfl audit`` on a shared run):
        any damage — truncated or bit-flipped files, wrong types in the JSON,
        a missing file — is one :class:`~osfl.errors.DataError` naming the file.
        """
        src = Path(dir)
        doc_path = src / _JSON
        if not doc_path.exists():
            raise DataError(f"{src} is not an observation directory (no {_JSON})")
        try:
            return cls._read(src, doc_path)
        except DataError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as e:
            raise DataError(f"{src}: damaged observation ({type(e).__name__}: {e})") from e

    @classmethod
    def _read(cls, src: Path, doc_path: Path) -> Observation:
        doc = jsonio.loads(doc_path.read_text())
        if not isinstance(doc, dict):
            raise DataError(f"{doc_path}: not a JSON object")
        bpath = (src / str(doc["broadcast"])).resolve()
        # the reference is ours, but the directory may come from anyone: stay inside it
        if not bpath.is_relative_to(src.resolve().parent):
            raise DataError(f"{doc_path}: broadcast path {doc['broadcast']!r} leaves the run")
        truth = doc.get("truth")
        if truth is not None and not isinstance(truth, dict):
            raise DataError(f"{doc_path}: truth must be an object")
        if (src / _TRUTH).exists():
            truth = {**(truth or {}), **load_file(str(src / _TRUTH))}
        upload = load_file(str(src / _UPLOAD))
        history = load_file(str(src / _HISTORY)) if (src / _HISTORY).exists() else {}
        # recordings made before `history` had its own file kept it in the upload
        history.update({k: upload.pop(k) for k in list(upload) if k.startswith(HISTORY_PREFIX)})
        meta, hparams = doc.get("upload_meta") or {}, doc.get("hparams") or {}
        if not isinstance(meta, dict) or not isinstance(hparams, dict):
            raise DataError(f"{doc_path}: upload_meta and hparams must be objects")
        return cls(
            client_id=int(doc["client_id"]),
            round=int(doc["round"]),
            broadcast=load_file(str(bpath)) if bpath.exists() else {},
            upload=upload,
            upload_meta=meta,
            hparams=hparams,
            truth=truth,
            history=history,
        )


def _cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu") for k, v in tensors.items()}


def observe(
    client: int,
    round: int,
    *,
    broadcast: Mapping[str, torch.Tensor],
    upload: Mapping[str, torch.Tensor],
    upload_meta: Mapping[str, Any] | None = None,
    hparams: Mapping[str, Any] | None = None,
    truth: Mapping[str, Any] | None = None,
    history: Mapping[str, torch.Tensor] | None = None,
) -> Observation:
    """The :class:`Observation` of one exchange, tensors detached on the CPU.

    The runtime's recorder, the audits, :func:`osfl.privacy.simulate.simulate_observation`
    and the benchmarks all build Observations here, so they agree on where
    each part goes.
    """
    return Observation(
        client_id=int(client),
        round=int(round),
        broadcast=_cpu(broadcast),
        upload=_cpu(upload),
        upload_meta=dict(upload_meta or {}),
        hparams=dict(hparams or {}),
        truth=None if truth is None else dict(truth),
        history=_cpu(history or {}),
    )


def load_observations(root: str | Path) -> list[Observation]:
    """Every observation under ``root`` (any depth), sorted by (round, client)."""
    base = Path(root)
    if not base.exists():
        raise DataError(f"no observations at {base}")
    obs = [Observation.load(p.parent) for p in sorted(base.rglob(_JSON))]
    return sorted(obs, key=lambda o: (o.round, o.client_id))
