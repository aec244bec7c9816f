"""What identifies a job across processes and restarts: :func:`job_parts`
(JSON-able) and its digest.

Under Flower the server and each client build their own
:class:`~osfl.fl.runtime.base.Job` from the same spec; the digest in every
message makes two sides started with different configs fail loudly instead of
diverging. A resumed run compares it with the one its checkpoint was saved
under, so a checkpoint is never continued by another job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from osfl.fl.cache import transform_key
from osfl.fl.runtime.base import Job, PartitionedData

__all__ = ["job_digest", "job_parts", "parts_mismatch"]


def _plain(obj: Any) -> Any:
    """A JSON-able view of configs (dataclasses, mappings) for hashing."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return _plain(asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return repr(obj)


def job_parts(job: Job) -> dict[str, Any]:
    """What makes two processes' jobs equal (JSON-able): the method, its config
    and public hyper-parameters (local recipe, FL scheme, any defence wrapper),
    the model, the task, the seed and — in a rehearsal, where every side holds
    the same data set and partition — the data's content and the federation."""
    method, run = job.method, job.run
    parts: dict[str, Any] = {
        "method": method.name,
        "method_config": _plain(method.config),
        "public_hparams": _plain(method.public_hparams()),
        "model": _plain(run.model.key()),
        "train": _plain(run.train),
        "transforms": [transform_key(run.train_transform), transform_key(run.eval_transform)],
        "num_classes": int(run.num_classes),
        "classes": list(run.classes),
        "image_shape": list(run.image_shape),
        "num_clients": int(job.num_clients),
        "seed": int(job.seed),
    }
    if isinstance(job.clients, PartitionedData):
        parts["data"] = job.clients.train.fingerprint()
        parts["federation"] = job.clients.federation.key()
    return parts


def job_digest(job: Job) -> str:
    """A short sha256 of :func:`job_parts`."""
    text = json.dumps(job_parts(job), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parts_mismatch(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> str:
    """A readable list of the parts that differ (``""`` when none do)."""
    keys = sorted(set(mine) | set(theirs))
    diffs = [
        f"{k}: here {json.dumps(mine.get(k), default=repr)[:120]} vs "
        f"server {json.dumps(theirs.get(k), default=repr)[:120]}"
        for k in keys
        if json.dumps(mine.get(k), sort_keys=True, default=repr)
        != json.dumps(theirs.get(k), sort_keys=True, default=repr)
    ]
    return "; ".join(diffs)
