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
``sites``           ``true``: real sites, each SuperNode reads its own data
                    (node config ``data``, optionally ``test-data``) and the
                    server holds none; ``false`` (default): a rehearsal, every
                    party builds the whole federation from the config
``server-test``     a data source the server evaluates on (``sites`` only;
                    ``""``: the sites evaluate the final model themselves)
``resume``          ``true``: continue the unfinished run in ``out-dir``
``site-registry``   the server's site registry, a JSON file: which node id
                    plays each partition id, and each site's declared size
                    (sites and rehearsals alike; docs/flower-security.md)
``keep-node``       ``"<partition-id>=<node id> ..."``: the node that plays
                    a partition id, where no registry says it (two nodes
                    claiming one partition id otherwise stop the run)
==================  ==========================================================

Node-config keys a SuperNode of a ``sites`` run reads: ``partition-id`` (its
client id), ``data`` (its train data, any source spec such as
``imagefolder:/srv/site3``), ``test-data`` (its test data; default: the test
split of ``data``) and ``state-dir`` (where it keeps its client state between
rounds, so a restarted server finds it).
"""

from __future__ import annotations

import dataclasses
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from osfl.errors import ConfigError
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.identity import job_digest, job_parts, parts_mismatch

__all__ = [
    "JOBS",
    "JobBuilder",
    "JobCache",
    "JobSpec",
    "job_digest",
    "job_parts",
    "parse_keep_nodes",
    "parts_mismatch",
]


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
    sites: bool = False
    server_test: str = ""
    resume: bool = False
    #: the ServerApp's site registry (a JSON file on the server's host:
    #: partition id -> registered node id and declared size; real sites)
    site_registry: str = ""
    #: run config ``keep-node``: (partition id, node id) pairs the operator bound
    keep_nodes: tuple[tuple[int, int], ...] = ()
    #: a site's id and own data specs (``partition-id``, ``data``, ``test-data``)
    node: tuple[tuple[str, str], ...] = ()

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
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
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
            sites=get("sites", bool, False),
            server_test=get("server-test", str, ""),
            resume=get("resume", bool, False),
            site_registry=get("site-registry", str, ""),
            keep_nodes=parse_keep_nodes(get("keep-node", str, "")),
        )

    def with_node(self, node_config: Mapping[str, Any]) -> JobSpec:
        """This spec with a site's own data specs from its node config (a
        ``sites`` run only; a rehearsal node builds from the config alone)."""
        if not self.sites:
            return self
        items = tuple(
            (key, str(node_config[key])) for key in NODE_KEYS if node_config.get(key) is not None
        )
        return dataclasses.replace(self, node=items)

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
            "sites": bool(self.sites),
            "server-test": self.server_test,
            "resume": bool(self.resume),
            "site-registry": self.site_registry,
            "keep-node": " ".join(f"{pid}={node}" for pid, node in self.keep_nodes),
        }


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes superscripts)."""
    return text.isascii() and text.isdigit()


def parse_keep_nodes(text: str) -> tuple[tuple[int, int], ...]:
    """Run config ``keep-node`` (``"1=5512046195451640853 2=..."``) as
    ``(partition id, node id)`` pairs; each partition id and node id once."""
    pairs: list[tuple[int, int]] = []
    for item in text.split():
        pid, sep, node = item.partition("=")
        if not (sep and _digits(pid) and _digits(node)):
            raise ConfigError(
                f"run config 'keep-node': {item[:40]!r} is not <partition-id>=<node id> "
                "(both non-negative integers)"
            )
        pairs.append((int(pid), int(node)))
    for i, what in ((0, "partition-id"), (1, "node id")):
        values = [p[i] for p in pairs]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(f"run config 'keep-node' names {what} {twice[0]} twice")
    return tuple(sorted(pairs))


#: The node-config keys that name a site's own data (see the module docstring).
NODE_KEYS = ("partition-id", "data", "test-data")

#: Builds a process's job from the spec (the osfl experiment builder, or a test's).
JobBuilder = Callable[[JobSpec], Job]


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

    def __reduce__(self) -> tuple[Callable[[], JobCache], tuple[()]]:
        """Pickle by role, never by value. Flower's simulation engine ships the
        ClientApp to every Ray actor with cloudpickle, which pickles the
        handlers' closures and the globals they use by value; a lock cannot be
        pickled, and a built job (data, federation, model) must not travel.
        So the process-wide :data:`JOBS` unpickles as the receiving process's
        own :data:`JOBS` (every message an actor answers then hits its one
        built job), and any other cache as a new empty one."""
        return (process_jobs, ()) if self is JOBS else (JobCache, ())


def process_jobs() -> JobCache:
    """This process's :data:`JOBS` (what a pickled :data:`JOBS` unpickles as;
    a module-level function, so cloudpickle pickles it by reference)."""
    return JOBS


#: The process-wide cache the ClientApps of this process share.
JOBS = JobCache()
