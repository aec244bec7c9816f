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

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from osfl.errors import ConfigError
from osfl.fl.client_training import train_clients_together
from osfl.fl.context import ClientState
from osfl.fl.method import SharedTrainingStep, capability, rounds_of
from osfl.fl.observers import Observer
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
        futures = (
            {c: self.pool.submit(self.turn, c, round, payload) for c in clients}
            if self.pool
            else {}
        )
        turns: dict[int, ClientTurn] = {}
        for c in clients:  # collected in client order: the aggregation order is fixed
            turns[c] = futures[c].result() if self.pool else self.turn(c, round, payload)
            task.advance()
        return turns

    def client_states(self) -> dict[int, ClientState]:
        return {
            c: ClientState.from_bytes(raw, client=c)
            for c, raw in sorted(self.states.items())
            if raw
        }

    def restore(self, states: Mapping[int, bytes]) -> None:
        self.states.update(states)

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
                pool.shutdown()


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
