"""The round loop every runtime runs (docs/design.md §1), with the transport to
the clients as its one variable part.

It follows Flower's strategy template (``flwr/serverapp/strategy/strategy.py::
Strategy.start``) and the Method docstring::

    method.check(); state = method.init_state()
    for r in range(rounds_of(method)):
        clients = sample_clients(method, r, N, rng)   # rng from the seed only
        payload = method.broadcast(state, r).to_bytes()
        got     = transport.collect(inbox, state, r, clients, payload)  # the variable part
        state   = method.aggregate(state, got.uploads, r)      # in client order
                  # or, from a summing transport: aggregate_mean(state, got.mean, r)
    metrics = evaluate(method.predictor(state))

Collection is one step with transports behind it: a :class:`ClientTransport`
(the simulation's in-process clients, a Flower Grid) brings back each client's
upload bytes, and every one takes the one path in, :class:`Inbox` (its size
checked on the raw bytes before parsing, parsed with safetensors, never pickle,
validated against its client's spec with ``num_samples`` bounded by what the
server knows of the client, screened by the method; a refused one is logged,
recorded with its reason and bytes, and dropped); a summing transport (SecAgg+,
:mod:`osfl.flower.secagg_server`) brings back only the clients' weighted mean,
which a method that declares :class:`~osfl.fl.method.SecureAggregation`
aggregates. Either way the loop gets a :class:`RoundUploads`, and the rest of
the round — the ``server.min_clients`` check, aggregation, byte accounting,
the round's record, checkpoints, evaluation (:mod:`osfl.fl.runtime.evaluation`,
whose payloads the transport carries too) — is written once. Observers
(privacy recorders, checkpoints, events) see every message through one fan-out.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientState
from osfl.fl.method import Screening, SecureAggregation, capability, rounds_of, sample_clients
from osfl.fl.observers import ByteCounter, Observer, Observers
from osfl.fl.own_models import ClientScores
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Job, RoundRecord, RunResult
from osfl.fl.runtime.checkpoint import PendingUpload, Resume, RoundCheckpoints
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.evaluation import RoundEvaluation, Scoring
from osfl.fl.runtime.identity import job_digest
from osfl.fl.runtime.server_log import server_warnings
from osfl.fl.runtime.sites import SiteScore
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Broadcast, Upload, UploadSpec, receive, size_limit

log = logging.getLogger(__name__)


@dataclass
class RoundUploads:
    """What the server holds of one round once its transport has collected it:
    the accepted clients' validated ``uploads`` (in client order) or, from a
    summing transport, only their weighted ``mean``; why the others are out;
    bytes per client (``bytes_up``: accepted uploads; ``bytes_down``: every
    client asked); the clients' training warnings; and the seconds the server
    spent validating inside the collection (``server_s``)."""

    accepted: list[int]
    refused: dict[int, str]
    uploads: dict[int, Upload] = field(default_factory=dict)
    mean: Upload | None = None
    bytes_up: dict[int, int] = field(default_factory=dict)
    bytes_down: dict[int, int] = field(default_factory=dict)
    bytes_refused: int = 0
    warnings: dict[int, list[str]] = field(default_factory=dict)
    server_s: float = 0.0


class Transport(Scoring, Protocol):
    """Delivers one round's broadcast to its clients and brings back what the
    server may hold of their uploads; carries the evaluation's payloads to the
    clients (:class:`~osfl.fl.runtime.evaluation.Scoring`)."""

    #: Tags the checkpoints of its rounds ("" for individual uploads), so that a
    #: run is never resumed under another transport's guarantees.
    checkpoint_tag: str

    def collect(
        self, inbox: Inbox, state: Any, round: int, clients: list[int], payload: bytes
    ) -> RoundUploads:
        """The round's uploads, through ``inbox`` where they are individual."""
        ...

    def client_states(self) -> dict[int, ClientState]:
        """The states the clients keep, where this transport can see them
        (in-process clients; empty for clients in other processes)."""
        ...

    def restore(self, states: Mapping[int, bytes]) -> None:
        """Give in-process clients back their states (a resumed run); clients
        in other processes keep their own, and ignore this."""
        ...


class ClientTransport(ABC):
    """A transport whose clients each send their own upload: ``exchange``
    brings back their turns, and :meth:`collect` takes every upload through
    the :class:`Inbox` (an upload accepted before a restart is not asked for
    again)."""

    checkpoint_tag = ""

    @abstractmethod
    def exchange(
        self, round: int, clients: list[int], payload: bytes, task: ProgressTask
    ) -> dict[int, ClientTurn]:
        """Every client's :class:`ClientTurn`, keyed by client id (``task``
        advances once per finished client)."""

    @abstractmethod
    def client_states(self) -> dict[int, ClientState]: ...

    @abstractmethod
    def restore(self, states: Mapping[int, bytes]) -> None: ...

    @abstractmethod
    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]: ...

    @abstractmethod
    def score_client_models(self, payload: bytes, clients: list[int]) -> ClientScores: ...

    def collect(
        self, inbox: Inbox, state: Any, round: int, clients: list[int], payload: bytes
    ) -> RoundUploads:
        kept = inbox.kept(round, clients)
        if kept:  # accepted before a restart: not asked again
            log.info("round %d: %d upload(s) kept from before the restart", round, len(kept))
            self.restore({c: p.state for c, p in kept.items() if p.state is not None})
        with inbox.task(round, "clients", len(clients) - len(kept)) as task:
            asked = self.exchange(round, [c for c in clients if c not in kept], payload, task)
        turns = {
            c: asked[c]
            if c in asked
            else ClientTurn(upload=kept[c].upload, state=kept[c].state, warnings=kept[c].warnings)
            for c in clients
        }
        got = inbox.receive(state, round, turns)
        got.bytes_down = dict.fromkeys(clients, len(payload))
        return got


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


#: the most characters of one refusal reason kept (log, events, record)
MAX_REASON_CHARS = 300


def refusal(client: int, error: Exception) -> str:
    """Why client ``client``'s upload was refused: an :class:`UploadError`'s
    own words, or what else went wrong while decoding, validating or
    screening it (a hostile upload may trip any of them; it is still only
    that client's refusal, never the round's end). Cut to
    :data:`MAX_REASON_CHARS`: a reason may quote the attacker's values (a
    401-digit ``num_samples``), and the log and the record must not carry
    whatever an attacker sends."""
    if isinstance(error, UploadError):
        text = str(error)
    else:
        text = f"[client {client}, field '*'] {type(error).__name__} while checking it: {error}"
    if len(text) <= MAX_REASON_CHARS:
        return text
    return f"{text[:MAX_REASON_CHARS]}… ({len(text) - MAX_REASON_CHARS} more characters)"


class Inbox:
    """The server's receiving side of one job: the spec each client's upload
    must meet and the one path every individual upload takes in; what the
    observers and the round checkpoints see of accepted uploads."""

    def __init__(self, job: Job, observers: Observers, checkpoints: RoundCheckpoints | None):
        self.job, self.obs, self.checkpoints = job, observers, checkpoints
        self.method = job.method

    def task(self, round: int, what: str, total: int) -> AbstractContextManager[ProgressTask]:
        """A progress bar for the collection of ``round``."""
        label = f"{self.method.name}: round {round + 1}/{rounds_of(self.method)}, {what}"
        return self.job.run.progress.task(label, total)

    def kept(self, round: int, clients: Sequence[int]) -> dict[int, PendingUpload]:
        """Uploads of ``round`` accepted before a restart, for ``clients``."""
        if self.checkpoints is None:
            return {}
        return {c: p for c, p in self.checkpoints.pending(round).items() if c in clients}

    def spec_for(self, state: Any, r: int, c: int) -> UploadSpec:
        """The method's spec for client ``c``, with ``meta.num_samples`` bounded
        by what the server knows of the client's data (its partition size in a
        rehearsal, else ``server.max_num_samples``): one upload cannot claim the
        weight of the whole federation."""
        spec = self.method.upload_spec(state, r, c)
        count = spec.meta.get("num_samples")
        if count is None:
            return spec
        known = self.job.clients.size(c)
        bound = known if known is not None else self.job.run.server.max_num_samples
        high = bound if count.high is None else min(count.high, bound)
        return dataclasses.replace(
            spec, meta={**spec.meta, "num_samples": dataclasses.replace(count, high=high)}
        )

    def accept(self, state: Any, r: int, c: int, raw: bytes) -> Upload:
        """Client ``c``'s upload bytes, size-checked before parsing, parsed,
        validated against its spec and screened by the method; anything wrong
        is an :class:`UploadError` (the upload is then refused)."""
        spec = self.spec_for(state, r, c)
        limits = [x for x in (size_limit(spec), self.job.run.server.max_upload_bytes) if x]
        upload = receive(raw, spec, client=c, limit=min(limits) if limits else None)
        screening = capability(self.method, Screening)
        why = screening.screen(state, r, c, upload) if screening is not None else None
        if why is not None:  # a judgement on the upload as a whole
            raise UploadError(why, client=c, field="*")
        return upload

    def receive(self, state: Any, r: int, turns: Mapping[int, ClientTurn]) -> RoundUploads:
        """Parse and validate every upload; refused ones are logged and dropped."""
        t = time.perf_counter()
        got = RoundUploads(accepted=[], refused={})
        for c, turn in turns.items():
            if turn.warnings:
                got.warnings[c] = list(turn.warnings)
            raw = turn.upload
            if raw is None:
                got.refused[c] = turn.failure or "no upload"
                log.warning("round %d: client %d sent nothing: %s", r, c, got.refused[c])
                continue
            try:
                upload = self.accept(state, r, c, raw)
            except Exception as e:  # anything one client's bytes cause is its refusal
                got.refused[c] = refusal(c, e)
                got.bytes_refused += len(raw)
                log.warning("round %d: upload refused: %s", r, got.refused[c])
                continue
            got.bytes_up[c] = len(raw)
            self.obs.on_upload(r, c, upload, len(raw), truth=self.truth_of(c, turn))
            got.uploads[c] = upload
            if self.checkpoints is not None:
                self.checkpoints.keep(r, c, PendingUpload(raw, turn.state, turn.warnings))
        got.accepted = sorted(got.uploads)
        got.server_s = time.perf_counter() - t
        return got

    def truth_of(self, c: int, turn: ClientTurn) -> dict[str, Any] | None:
        """What client ``c`` really did: the labels of its local steps in order
        (``label_source="steps"``) when it trained with the engine in this
        process, else its data's labels (``"data"``: a cache hit, a method
        without local steps, or a client in another process)."""
        if turn.step_labels is not None:
            labels, source = turn.step_labels, "steps"
        elif not self.job.clients.holds_data:  # real sites: the server knows nothing
            return None
        else:
            labels, source = self.job.clients.data(c).labels, "data"
        return {"labels": labels, "num_classes": self.job.run.num_classes, "label_source": source}


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
        self.obs = Observers(observers)
        self.rng = np.random.default_rng(derive_seed(job.seed, "client-sampling"))
        self.times = {"client": 0.0, "server": 0.0, "eval": 0.0}
        self.checkpoints = RoundCheckpoints(job.state_dir) if job.state_dir is not None else None
        self.inbox = Inbox(job, self.obs, self.checkpoints)
        self.evaluation = RoundEvaluation(job, transport, self.times)
        tag = transport.checkpoint_tag
        self.digest = job_digest(job) + (f"+{tag}" if tag else "")

    # --- the server side ------------------------------------------------------------
    def require_enough(self, got: RoundUploads, r: int, asked: int) -> None:
        """Stop the run when fewer than ``server.min_clients`` uploads are usable."""
        need = self.job.run.server.min_clients
        if len(got.accepted) >= need:
            return
        why = "; ".join(
            w if w.startswith(f"[client {c}") else f"client {c}: {w}"
            for c, w in sorted(got.refused.items())
        )
        if not got.accepted:
            raise UploadError(f"round {r}: every upload was refused ({why or 'none were sent'})")
        raise UploadError(
            f"round {r}: {len(got.accepted)} usable upload(s) of {asked} client(s), fewer than "
            f"server.min_clients={need} ({why or 'none were sent'})"
        )

    def aggregate(self, state: Any, got: RoundUploads, r: int) -> Any:
        """The method's new state from the round's individual uploads (in the
        order of their clients' ids, whatever order they arrived in), or from
        their weighted mean when the transport summed them."""
        if got.mean is None:
            return self.method.aggregate(state, {c: got.uploads[c] for c in got.accepted}, r)
        secure = capability(self.method, SecureAggregation)
        if secure is None:
            raise ConfigError(f"{self.method.name} cannot aggregate a weighted mean of uploads")
        return secure.aggregate_mean(state, got.mean, r)

    def one_round(self, state: Any, r: int) -> tuple[Any, RoundRecord]:
        method, job = self.method, self.job
        t = time.perf_counter()
        clients = sample_clients(method, r, job.num_clients, self.rng)
        payload = method.broadcast(state, r).to_bytes()
        t_server = time.perf_counter() - t
        sent = Broadcast.from_bytes(payload)  # what every client of the round received
        for c in clients:
            self.obs.on_broadcast(r, c, sent, len(payload))

        t = time.perf_counter()
        got = self.transport.collect(self.inbox, state, r, list(clients), payload)
        t_client = time.perf_counter() - t - got.server_s
        self.require_enough(got, r, len(clients))

        t = time.perf_counter()
        with server_warnings() as said:
            state = self.aggregate(state, got, r)
        t_server += got.server_s + time.perf_counter() - t
        for c, n in got.bytes_up.items():
            self.bytes.up[r][c] += n
        for c, n in got.bytes_down.items():
            self.bytes.down[r][c] += n
        self.times["client"] += t_client
        self.times["server"] += t_server
        record = RoundRecord(
            round=r,
            clients=list(clients),
            accepted=list(got.accepted),
            refused=dict(got.refused),
            bytes_up=sum(got.bytes_up.values()),
            bytes_down=sum(got.bytes_down.values()),
            bytes_refused=got.bytes_refused,
            time_client_s=t_client,
            time_server_s=t_server,
            warnings=dict(got.warnings),
            server_warnings=list(said),
        )
        return state, record

    # --- the loop -------------------------------------------------------------------
    def save(self, state: Any, done: int, records: list[RoundRecord]) -> None:
        """Everything needed to go on after ``done`` finished rounds."""
        if self.checkpoints is None:
            return
        raw = {c: s.to_bytes() for c, s in self.transport.client_states().items()}
        self.checkpoints.save(
            Resume(
                job=self.digest,
                round=done,
                state=state,
                records=[r.as_dict() for r in records],
                bytes_up={r: dict(c) for r, c in self.bytes.up.items()},
                bytes_down={r: dict(c) for r, c in self.bytes.down.items()},
                times=dict(self.times),
                client_states=raw,
            )
        )

    def restart(self) -> tuple[Any, int, list[RoundRecord]]:
        """``(state, first round to run, finished records)``: from the job's
        checkpoint when it has one, else from ``init_state``."""
        saved = self.checkpoints.load(self.digest) if self.checkpoints is not None else None
        if saved is None:
            t = time.perf_counter()
            state = self.method.init_state()
            self.times["server"] += time.perf_counter() - t
            return state, 0, []
        log.info(
            "%s: resuming after round %d of %d",
            self.method.name,
            saved.round,
            rounds_of(self.method),
        )
        for r in range(saved.round):  # the sampling generator, replayed from the seed
            sample_clients(self.method, r, self.job.num_clients, self.rng)
        for r, per in saved.bytes_up.items():
            self.bytes.up[r].update(per)
        for r, per in saved.bytes_down.items():
            self.bytes.down[r].update(per)
        self.times.update(saved.times)
        self.transport.restore(saved.client_states)
        records = [_record(d) for d in saved.records]
        return saved.state, saved.round, records

    def execute(self) -> RunResult:
        method, obs, job = self.method, self.obs, self.job
        method.check()
        obs.on_run_start(method.name, job.run)
        state, start, records = self.restart()
        n_rounds = rounds_of(method)
        bar = job.run.progress.task(f"{method.name}: rounds", n_rounds) if n_rounds > 1 else None
        with torch_threads(self.threads), bar or nullcontext():
            if bar is not None and start:
                bar.advance(start)
            for r in range(start, n_rounds):
                state, record = self.one_round(state, r)
                records.append(record)
                if r < n_rounds - 1:
                    if self.evaluation.due(r):
                        predicted = method.predictor(state)
                        record.metrics = self.evaluation.metrics(state, predicted, r, records)
                    obs.on_round_end(r, state, record.as_dict())
                self.save(state, r + 1, records)
                if bar is not None:
                    bar.advance()

        t = time.perf_counter()
        predictor = method.predictor(state)
        self.times["server"] += time.perf_counter() - t
        metrics = (
            self.evaluation.at_sites(state)
            if job.evaluate_at_clients
            else self.evaluation.metrics(state, predictor, n_rounds - 1, records)
        )
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


def _record(d: Mapping[str, Any]) -> RoundRecord:
    """A :class:`RoundRecord` from its ``as_dict`` (client ids back to ints)."""
    fields = {f.name for f in dataclasses.fields(RoundRecord)}
    rec = RoundRecord(**{k: v for k, v in d.items() if k in fields})
    rec.refused = {int(c): str(w) for c, w in rec.refused.items()}
    rec.warnings = {int(c): list(w) for c, w in rec.warnings.items()}
    return rec
