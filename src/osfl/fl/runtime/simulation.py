"""The in-process simulation runtime: carries a method through its rounds
exactly as a real deployment would (docs/design.md §1), every client in this
process.

The round loop is :class:`~osfl.fl.runtime.rounds.RoundLoop`, shared with the
Flower runtimes; only the transport differs: here each client's turn is a
call of :func:`~osfl.fl.runtime.client.run_client` on its own data, with its
state from earlier rounds kept as bytes in a dict (what a SuperNode keeps in
Flower's ``Context.state``). Client sampling and each client's generator are
derived from the seed alone, so a run is deterministic on CPU whether its
clients run one after another or in a thread pool (torch releases the GIL in
its kernels; uploads are aggregated in client order).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from osfl.errors import ConfigError
from osfl.fl.client_training import train_clients_together
from osfl.fl.context import ClientState
from osfl.fl.method import SharedTrainingStep, capability, rounds_of
from osfl.fl.observers import Observer
from osfl.fl.own_models import ClientScores, score_kept_states
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Evaluator, Job, PartitionedData, RunResult
from osfl.fl.runtime.client import ClientTurn, client_context, run_client
from osfl.fl.runtime.rounds import ClientTransport, RoundLoop
from osfl.fl.runtime.sites import SiteScore
from osfl.fl.training import training_scope
from osfl.fl.upload import Broadcast

if TYPE_CHECKING:
    from osfl.data.federation import Federation
    from osfl.data.imageset import ImageSet
    from osfl.fl.context import RunContext
    from osfl.fl.method import Method

log = logging.getLogger(__name__)


class InProcessClients(ClientTransport):
    """The transport of the simulation: clients as function calls, optionally
    in a thread pool of ``parallel`` workers; each client's state is kept here
    between rounds."""

    def __init__(
        self, job: Job, pool: ThreadPoolExecutor | None = None, *, batch_clients: bool = False
    ):
        self.job = job
        self.pool = pool
        self.batch_clients = batch_clients
        self.states: dict[int, bytes | None] = {}

    def train_together(self, round: int, clients: list[int], payload: bytes) -> None:
        """With ``batch_clients``, train the round's clients as one batched step
        when the method declares a shared step; each turn is then a cache hit."""
        job = self.job
        shared = capability(job.method, SharedTrainingStep)
        if not self.batch_clients or len(clients) < 2 or shared is None:
            return
        plan = shared.shared_training(Broadcast.from_bytes(payload), round)
        if plan is None:
            return
        contexts = {
            c: (
                client_context(job.run, client=c, round=round, seed=job.seed),
                job.clients.data(c),
            )
            for c in clients
        }
        with training_scope(round, multi_round=rounds_of(job.method) > 1):
            train_clients_together(plan, contexts)

    def turn(self, c: int, r: int, payload: bytes) -> ClientTurn:
        job = self.job
        turn = run_client(
            job.method,
            job.run,
            client=c,
            round=r,
            seed=job.seed,
            payload=payload,
            data=job.clients.data(c),
            state=self.states.get(c),
        )
        self.states[c] = turn.state
        return turn

    def exchange(
        self, round: int, clients: list[int], payload: bytes, task: ProgressTask
    ) -> dict[int, ClientTurn]:
        self.train_together(round, clients, payload)
        gate = ClientGate()

        def gated_turn(c: int) -> ClientTurn:
            if not gate.enter(c):
                raise CancelledError  # the round stopped before this client started
            try:
                return self.turn(c, round, payload)
            except BaseException:
                gate.stop()  # before this future completes: no later client starts
                raise

        futures = {c: self.pool.submit(gated_turn, c) for c in clients} if self.pool else {}
        turns: dict[int, ClientTurn] = {}
        try:
            for c in clients:  # collected in client order: the aggregation order is fixed
                turns[c] = futures[c].result() if self.pool else self.turn(c, round, payload)
                task.advance()
        except BaseException as e:  # ^C (KeyboardInterrupt) or a bug: start no further client
            if futures:
                cancel_queued(gate, futures, round, interrupted=isinstance(e, KeyboardInterrupt))
            raise
        return turns

    def client_states(self) -> dict[int, ClientState]:
        return {
            c: ClientState.from_bytes(raw, client=c)
            for c, raw in sorted(self.states.items())
            if raw
        }

    def restore(self, states: Mapping[int, bytes]) -> None:
        self.states.update(states)

    def score_client_models(self, payload: bytes, clients: list[int]) -> ClientScores:
        """Each client scores its own model from the state kept here."""
        job = self.job
        return score_kept_states(job.method, job.evaluator, self.states, payload, clients)

    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]:
        raise ConfigError(
            "evaluation at the clients needs real sites, each with its own test set; "
            "in simulation the server evaluates on the test split"
        )


class SimulationRuntime:
    """``parallel_clients > 1`` trains clients in a thread pool, each with
    ``threads_per_client`` torch threads (default: the current count divided by
    ``parallel_clients``; sequential runs keep the current count). The result
    equals a sequential run with the same ``threads_per_client`` bit for bit.
    (The thread count itself matters: torch's CPU reductions are split per
    thread, so 1 and 2 threads per client differ in the last bits.)"""

    name = "simulation"

    def __init__(
        self,
        parallel_clients: int = 1,
        threads_per_client: int | None = None,
        *,
        batch_clients: bool = False,
    ):
        self.batch_clients = batch_clients  # one batched step for a shared client step
        if parallel_clients < 1:
            raise ConfigError(f"parallel_clients must be >= 1, got {parallel_clients}")
        if threads_per_client is not None and not (
            type(threads_per_client) is int and threads_per_client >= 1
        ):
            raise ConfigError(f"threads_per_client must be >= 1, got {threads_per_client!r}")
        self.parallel = parallel_clients
        self.threads = threads_per_client

    def pinned_threads(self) -> int | None:
        """Torch threads during the rounds (see the class docstring)."""
        if self.threads is None and self.parallel > 1:
            return max(1, torch.get_num_threads() // self.parallel)
        return self.threads

    def execute(self, job: Job, *, observers: Sequence[Observer] = ()) -> RunResult:
        pool = ThreadPoolExecutor(self.parallel) if self.parallel > 1 else None
        try:
            transport = InProcessClients(job, pool, batch_clients=self.batch_clients)
            loop = RoundLoop(job, transport, observers, threads=self.pinned_threads())
            return loop.execute()
        finally:
            if pool is not None:
                # cancel_futures: after ^C, never start a queued client (exchange
                # already cancelled its round's; this is the backstop)
                pool.shutdown(cancel_futures=True)


class ClientGate:
    """Which client jobs of a round started; once stopped, none starts.

    ``Future.cancel`` alone leaves a race: a worker that finishes (or fails)
    takes the next queued job before the main thread, woken by that very
    result, can cancel it. Every job passes :meth:`enter` first, and a job
    that fails stops the gate before its future completes, so after a
    failure or ^C no further client starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._started: set[int] = set()

    def enter(self, client: int) -> bool:
        """Whether ``client``'s job may start (it is then counted as started)."""
        with self._lock:
            if self._stopped:
                return False
            self._started.add(client)
            return True

    def stop(self) -> frozenset[int]:
        """Let no further job start; returns the clients that did start."""
        with self._lock:
            self._stopped = True
            return frozenset(self._started)


def cancel_queued(
    gate: ClientGate,
    futures: Mapping[int, Future[ClientTurn]],
    round: int,
    *,
    interrupted: bool = True,
) -> list[int]:
    """Stop ``round``'s (0-based) client jobs not yet started and say so in one
    line; returns their client ids. A thread cannot be stopped, so the running
    ones finish first; their turns are discarded, and the run resumes
    (``osfl run --resume``) from the last checkpoint, which a cancelled client
    never touched. Without this, ``pool.shutdown()`` would start and wait
    for every queued client after ^C."""
    started = gate.stop()
    for f in futures.values():
        f.cancel()  # spares the pool dequeuing them (the gate already stops them)
    cancelled = sorted(c for c in futures if c not in started)
    running = sorted(c for c in started if not futures[c].done())
    if cancelled or running:
        log.warning(
            "%s in round %d: %d client job(s) not yet started cancelled%s",
            "interrupted" if interrupted else "stopped",
            round + 1,  # as the progress display counts
            len(cancelled),
            f", waiting for the {len(running)} running" if running else "",
        )
    return cancelled


def run_simulation(
    method: Method,
    run: RunContext,
    train: ImageSet,
    federation: Federation,
    *,
    observers: Sequence[Observer] = (),
    seed: int | None = None,
    parallel_clients: int = 1,
    threads_per_client: int | None = None,
    batch_clients: bool = False,
    evaluator: Evaluator | None = None,
    eval_every: int = 0,
) -> RunResult:
    """``method`` over ``federation`` (client index arrays into ``train``) on
    the simulation runtime: the short form of ``SimulationRuntime(...).execute(
    Job(...))`` for scripts and notebooks. ``seed`` defaults to ``run.seed``."""
    job = Job(
        method=method,
        run=run,
        clients=PartitionedData(train, federation),
        seed=run.seed if seed is None else seed,
        evaluator=evaluator,
        eval_every=eval_every,
    )
    runtime = SimulationRuntime(parallel_clients, threads_per_client, batch_clients=batch_clients)
    return runtime.execute(job, observers=observers)
