"""Train some of a run's clients into the client cache, and stop there
(``train_clients``, issue #40).

A paper-scale one-shot run can be longer than one GPU command (FAFI's 200
SALT epochs on five clients). Its clients are independent and every one is
stored in the content-keyed client cache (:mod:`osfl.fl.cache`) under a key
that names the client, never which others ran beside it; so the clients can
train over several commands, each filling the shared cache, and the last,
full run finds them all there. Such a partial run has no global model: it
neither aggregates nor evaluates, and its record says so
(``global_test_accuracy: null``, ``trained_clients``, a warning).

Each client takes the very path of a full run's round 0
(:meth:`~osfl.fl.runtime.simulation.InProcessClients.turn` on the broadcast
of ``init_state``, under the same torch thread count), so its cache entry is
the one the full run looks up; its upload is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from osfl.errors import ConfigError
from osfl.fl.method import rounds_of
from osfl.fl.runtime.base import Job, RoundRecord, RunResult
from osfl.fl.runtime.rounds import torch_threads
from osfl.fl.runtime.simulation import InProcessClients

__all__ = ["TRAIN_ONLY_WARNING", "train_only"]

#: The record's warning: what a table must not read as a result.
TRAIN_ONLY_WARNING = (
    "train_clients: trained and cached clients {ids} only; no aggregation, no accuracy "
    "(a later run with every client in the same cache computes it)"
)


def train_only(
    job: Job, clients: Sequence[int], *, threads: int | None, batch_clients: bool = False
) -> RunResult:
    """Train ``clients`` of ``job`` as a full run's round 0 would (through
    the run's client cache), then stop: a :class:`RunResult` with no state,
    no predictor and ``global_test_accuracy: None``."""
    method = job.method
    if rounds_of(method) != 1:
        raise ConfigError(
            f"train_clients trains one-shot clients; {method.name} runs {rounds_of(method)} rounds"
        )
    if job.run.cache is None:
        raise ConfigError("train_clients fills the client cache: set cache_dir")
    bad = [c for c in clients if not 0 <= c < job.num_clients]
    if bad:
        raise ConfigError(
            f"train_clients: client id(s) {bad} outside this federation of {job.num_clients} "
            f"clients (valid: 0..{job.num_clients - 1})"
        )
    method.check()
    ids = sorted(set(clients))
    t = time.perf_counter()
    payload = method.broadcast(method.init_state(), 0).to_bytes()
    transport = InProcessClients(job, batch_clients=batch_clients)
    with torch_threads(threads):
        transport.train_together(0, ids, payload)
        turns = {c: transport.turn(c, 0, payload) for c in ids}
    seconds = time.perf_counter() - t
    record = RoundRecord(
        round=0,
        clients=ids,
        accepted=[],
        refused={},
        bytes_up=0,
        bytes_down=0,
        bytes_refused=0,
        time_client_s=seconds,
        time_server_s=0.0,
        warnings={c: list(turn.warnings) for c, turn in turns.items() if turn.warnings},
    )
    failed = [f"client {c}: {turn.failure}" for c, turn in turns.items() if turn.failure]
    metrics = {
        "global_test_accuracy": None,
        "trained_clients": ids,
        "warnings": [TRAIN_ONLY_WARNING.format(ids=ids), *failed],
    }
    return RunResult(
        state=None,
        predictor=None,  # type: ignore[arg-type]  # no global model: nothing was aggregated
        rounds=[record],
        time_s={"client": seconds, "server": 0.0, "eval": 0.0, "total": seconds},
        bytes_up=0,
        bytes_down=0,
        metrics=metrics,
    )
