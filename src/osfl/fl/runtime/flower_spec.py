"""What the Flower ServerApp and every ClientApp agree on: the :class:`JobSpec`
in Flower's run config, and the digest of the job each side built from it.

Under Flower the server and each client are separate processes (or Ray
actors); they share no objects, only Flower's *run config*. So the experiment
travels as a :class:`JobSpec` and every process builds an equal
:class:`~osfl.fl.runtime.base.Job` from it — same data source, same
federation (same seed), same model, same training recipe, same method config.
:func:`job_digest` hashes what was built; the server puts it in every message
and a client whose own digest differs refuses to train, so two sides started
with different configs fail loudly instead of diverging.

Run-config keys (Flower's kebab-case; all optional):

==================  ==========================================================
``experiment``      path of an osfl YAML config, or the YAML text itself;
                    ``""`` = the embedded default experiment
``method``          the method to run; ``""`` = the config's first method
``seed``            the seed; ``-1`` = the config's first seed
``overrides``       dotted overrides, space-separated (``"train.epochs=2 ..."``)
``out-dir``         the server's run directory; ``""`` = ``runs/<stamp>-<name>-flower``
``round-timeout``   seconds the server waits for a round's replies (600)
``node-timeout``    seconds the server waits for the SuperNodes to connect (120)
==================  ==========================================================
"""

from __future__ import annotations

import hashlib
import json
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from osfl.errors import ConfigError
from osfl.fl.cache import transform_key
from osfl.fl.runtime.base import Job, PartitionedData


@dataclass(frozen=True)
class JobSpec:
    """The part of Flower's run config that says which job to build (see the
    module docstring for the keys). Frozen and hashable: it is the cache key of
    a process's built job."""

    experiment: str = ""
    method: str = ""
    seed: int | None = None
    overrides: tuple[str, ...] = ()
    out_dir: str = ""
    round_timeout: float = 600.0
    node_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.round_timeout <= 0 or self.node_timeout <= 0:
            raise ConfigError("round-timeout and node-timeout must be positive (seconds)")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> JobSpec:
        """Parse Flower's run config; unknown keys are ignored (an app may add
        its own), wrong types are a ConfigError naming the key."""

        def get(key: str, kind: type, default: Any) -> Any:
            value = run_config.get(key, default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ConfigError(f"run config {key!r} must be a {kind.__name__}, got {value!r}")
            return value

        seed = get("seed", int, -1)
        return cls(
            experiment=get("experiment", str, ""),
            method=get("method", str, ""),
            seed=None if seed < 0 else seed,
            overrides=tuple(shlex.split(get("overrides", str, ""))),
            out_dir=get("out-dir", str, ""),
            round_timeout=get("round-timeout", float, 600.0),
            node_timeout=get("node-timeout", float, 120.0),
        )

    def to_run_config(self) -> dict[str, str | int | float]:
        """The inverse of :meth:`from_run_config` (what ``flwr run -c`` or the
        app's ``pyproject.toml`` carries)."""
        return {
            "experiment": self.experiment,
            "method": self.method,
            "seed": -1 if self.seed is None else int(self.seed),
            "overrides": shlex.join(self.overrides),
            "out-dir": self.out_dir,
            "round-timeout": float(self.round_timeout),
            "node-timeout": float(self.node_timeout),
        }


#: Builds a process's job from the spec (the osfl experiment builder, or a test's).
JobBuilder = Callable[[JobSpec], Job]


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


class JobCache:
    """One built job per process: a Ray actor or a SuperNode's ClientApp process
    answers many messages of one run, and data + federation are built on the
    first one. Only the latest job is kept; the builder is held (and compared
    with ``is``) so that a new builder never hits an old entry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entry: tuple[JobBuilder, JobSpec, Job, str] | None = None

    def get(self, builder: JobBuilder, spec: JobSpec) -> tuple[Job, str]:
        """``(job, digest)`` of ``spec`` built by ``builder`` (once)."""
        with self._lock:
            if self._entry is not None and self._entry[0] is builder and self._entry[1] == spec:
                return self._entry[2], self._entry[3]
            job = builder(spec)
            self._entry = (builder, spec, job, job_digest(job))
            return job, self._entry[3]


#: The process-wide cache the ClientApps of this process share.
JOBS = JobCache()
