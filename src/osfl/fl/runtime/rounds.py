"""The round loop every runtime runs (DESIGN.md §1), with the transport to the
clients as its one variable part.

It follows Flower's strategy template (``flwr/serverapp/strategy/strategy.py::
Strategy.start``) and the Method docstring::

    method.check(); state = method.init_state()
    for r in range(method.rounds):
        clients = method.sample_clients(r, N, rng)    # rng from the seed only
        payload = method.broadcast(state, r).to_bytes()
        turns   = transport.exchange(r, clients, payload)      # the only variable part
        uploads = {c: parsed and validated against method.upload_spec(state, r, c)}
        state   = method.aggregate(state, uploads, r)          # in client order
    metrics = evaluate(method.predictor(state))

Every Broadcast and Upload goes through its safetensors bytes — precisely
what Flower carries — and every upload is validated before the server sees
it; a refused one is logged with its reason, recorded as refused with its
bytes, and dropped, and the round goes on with the others (a round with no
valid upload is an error). Observers (byte accounting, privacy recorders,
checkpoints, events) see every message through one fan-out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

import numpy as np
import torch

from osfl.errors import UploadError
from osfl.fl.context import ClientState
from osfl.fl.observers import ByteCounter, Observer, Observers
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Job, RoundRecord, RunResult
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Broadcast, Upload, validate

log = logging.getLogger(__name__)


class Transport(Protocol):
    """Delivers one round's broadcast to its clients and brings back their turns."""

    def exchange(
        self, round: int, clients: list[int], payload: bytes, task: ProgressTask
    ) -> dict[int, ClientTurn]:
        """Every client's :class:`ClientTurn`, keyed by client id (``task``
        advances once per finished client)."""
        ...

    def client_states(self) -> dict[int, ClientState]:
        """The states the clients keep, where this transport can see them
        (in-process clients; empty for clients in other processes)."""
        ...


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch intra-op threads, restoring the count after
    (``None``: leave it alone)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class RoundLoop:
    """One job's rounds over ``transport`` (see the module docstring).

    ``threads`` pins the torch threads during the rounds (clients running in
    this process share them), as every in-process runtime does.
    """

    def __init__(
        self,
        job: Job,
        transport: Transport,
        observers: Sequence[Observer] = (),
        *,
        threads: int | None = None,
    ):
        self.job, self.transport, self.threads = job, transport, threads
        self.method = job.method
        self.bytes = ByteCounter()
        self.obs = Observers([self.bytes, *observers])
        self.rng = np.random.default_rng(derive_seed(job.seed, "client-sampling"))
        self.times = {"client": 0.0, "server": 0.0, "eval": 0.0}

    # --- the server side ------------------------------------------------------------
    def receive(
        self, state: Any, r: int, turns: Mapping[int, ClientTurn]
    ) -> tuple[dict[int, Upload], dict[int, str], int, int]:
        """Parse and validate every upload; refused ones are logged and dropped."""
        uploads: dict[int, Upload] = {}
        refused: dict[int, str] = {}
        up_bytes = refused_bytes = 0
        for c, turn in turns.items():
            raw = turn.upload
            if raw is None:
                refused[c] = turn.failure or "no upload"
                log.warning("round %d: client %d sent nothing: %s", r, c, refused[c])
                continue
            try:
                upload = Upload.from_bytes(raw, client=c)
                validate(upload, self.method.upload_spec(state, r, c), client=c)
            except UploadError as e:
                refused[c] = str(e)
                refused_bytes += len(raw)
                log.warning("round %d: upload refused: %s", r, e)
                continue
            up_bytes += len(raw)
            self.obs.on_upload(r, c, upload, len(raw), truth=self.truth_of(c, turn))
            uploads[c] = upload
        if not uploads:
            raise UploadError(
                f"round {r}: every upload was refused ({'; '.join(refused.values())})"
            )
        return uploads, refused, up_bytes, refused_bytes

    def truth_of(self, c: int, turn: ClientTurn) -> dict[str, Any]:
        """What client ``c`` really did: the labels of its local steps in order
        (``label_source="steps"``) when it trained with the engine in this
        process, else its data's labels (``"data"``: a cache hit, a method
        without local steps, or a client in another process)."""
        if turn.step_labels is not None:
            labels, source = turn.step_labels, "steps"
        else:
            labels, source = self.job.clients.data(c).labels, "data"
        return {"labels": labels, "num_classes": self.job.run.num_classes, "label_source": source}

    def evaluate(self, predictor: Any) -> dict[str, Any]:
        evaluator = self.job.evaluator
        t = time.perf_counter()
        out = dict(evaluator(predictor)) if evaluator is not None else {}
        self.times["eval"] += time.perf_counter() - t
        return out

    def one_round(self, state: Any, r: int) -> tuple[Any, RoundRecord]:
        method, job = self.method, self.job
        t = time.perf_counter()
        clients = method.sample_clients(r, job.num_clients, self.rng)
        payload = method.broadcast(state, r).to_bytes()
        t_server = time.perf_counter() - t
        sent = Broadcast.from_bytes(payload)  # what every client of the round received
        for c in clients:
            self.obs.on_broadcast(r, c, sent, len(payload))

        t = time.perf_counter()
        label = f"{method.name}: round {r + 1}/{method.rounds}, clients"
        with job.run.progress.task(label, len(clients)) as task:
            turns = self.transport.exchange(r, clients, payload, task)
        t_client = time.perf_counter() - t

        t = time.perf_counter()
        uploads, refused, up_bytes, refused_bytes = self.receive(state, r, turns)
        state = method.aggregate(state, uploads, r)
        t_server += time.perf_counter() - t
        self.times["client"] += t_client
        self.times["server"] += t_server
        record = RoundRecord(
            round=r,
            clients=list(clients),
            accepted=sorted(uploads),
            refused=refused,
            bytes_up=up_bytes,
            bytes_down=len(payload) * len(clients),
            bytes_refused=refused_bytes,
            time_client_s=t_client,
            time_server_s=t_server,
        )
        return state, record

    # --- the loop -------------------------------------------------------------------
    def execute(self) -> RunResult:
        method, obs, job = self.method, self.obs, self.job
        method.check()
        obs.on_run_start(method.name, job.run)
        t = time.perf_counter()
        state = method.init_state()
        self.times["server"] += time.perf_counter() - t
        n_rounds = method.rounds
        records: list[RoundRecord] = []
        bar = job.run.progress.task(f"{method.name}: rounds", n_rounds) if n_rounds > 1 else None
        with torch_threads(self.threads), bar or nullcontext():
            for r in range(n_rounds):
                state, record = self.one_round(state, r)
                records.append(record)
                if r < n_rounds - 1:
                    every = job.eval_every
                    if every > 0 and (r + 1) % every == 0 and job.evaluator is not None:
                        record.metrics = self.evaluate(method.predictor(state))
                    obs.on_round_end(r, state, record.as_dict())
                if bar is not None:
                    bar.advance()

        t = time.perf_counter()
        predictor = method.predictor(state)
        self.times["server"] += time.perf_counter() - t
        metrics = self.evaluate(predictor)
        records[-1].metrics = metrics
        obs.on_round_end(n_rounds - 1, state, records[-1].as_dict())
        self.times["total"] = self.times["client"] + self.times["server"] + self.times["eval"]
        result = RunResult(
            state=state,
            predictor=predictor,
            rounds=records,
            time_s=dict(self.times),
            bytes_up=int(self.bytes.total_up),
            bytes_down=int(self.bytes.total_down),
            metrics=metrics,
            client_states=self.transport.client_states(),
        )
        obs.on_run_end(result)
        return result
