"""The round loop every runtime runs (docs/design.md §1), with the transport to the
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
what Flower carries — and every upload takes one path in (:meth:`RoundLoop.
accept`): its size is checked on the raw bytes before parsing, then it is
parsed (safetensors, never pickle), validated against its client's spec
(with ``num_samples`` bounded by what the server knows of the client) and
screened by the method; a refused one is logged with its reason, recorded as
refused with its bytes, and dropped, and the round goes on with the others (a
round with no valid upload is an error). Observers (byte accounting, privacy recorders,
checkpoints, events) see every message through one fan-out.
"""

from __future__ import annotations

import dataclasses
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
from osfl.fl.runtime.checkpoint import PendingUpload, Resume, RoundCheckpoints
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.identity import job_digest
from osfl.fl.runtime.sites import SiteScore, merge_site_scores
from osfl.fl.seeds import derive_seed
from osfl.fl.state_codec import state_to_bytes
from osfl.fl.upload import Broadcast, Upload, UploadSpec, receive, size_limit

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

    def restore(self, states: Mapping[int, bytes]) -> None:
        """Give in-process clients back their states (a resumed run); clients
        in other processes keep their own, and ignore this."""
        ...

    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]:
        """Have ``clients`` score the released final state (``payload``) on
        their own test sets: ``(scores, failures)`` by client."""
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
        self.checkpoints = RoundCheckpoints(job.state_dir) if job.state_dir is not None else None
        self.digest = job_digest(job)

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
                upload = self.accept(state, r, c, raw)
            except UploadError as e:
                refused[c] = str(e)
                refused_bytes += len(raw)
                log.warning("round %d: upload refused: %s", r, e)
                continue
            up_bytes += len(raw)
            self.obs.on_upload(r, c, upload, len(raw), truth=self.truth_of(c, turn))
            uploads[c] = upload
            if self.checkpoints is not None:
                self.checkpoints.keep(r, c, PendingUpload(raw, turn.state, turn.warnings))
        need = self.job.run.server.min_clients
        if len(uploads) < need:
            why = "; ".join(refused.values()) or "none were sent"
            if not uploads:
                raise UploadError(f"round {r}: every upload was refused ({why})")
            raise UploadError(
                f"round {r}: {len(uploads)} usable upload(s) of {len(turns)}, fewer than "
                f"server.min_clients={need} ({why})"
            )
        return uploads, refused, up_bytes, refused_bytes

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
        why = self.method.screen(state, r, c, upload)
        if why is not None:  # a judgement on the upload as a whole
            raise UploadError(why, client=c, field="*")
        return upload

    def truth_of(self, c: int, turn: ClientTurn) -> dict[str, Any] | None:
        """What client ``c`` really did: the labels of its local steps in order
        (``label_source="steps"``) when it trained with the engine in this
        process, else its data's labels (``"data"``: a cache hit, a method
        without local steps, or a client in another process)."""
        if turn.step_labels is not None:
            labels, source = turn.step_labels, "steps"
        elif self.job.clients.size(c) is None:  # a real site: the server knows nothing
            return None
        else:
            labels, source = self.job.clients.data(c).labels, "data"
        return {"labels": labels, "num_classes": self.job.run.num_classes, "label_source": source}

    def evaluate(self, predictor: Any) -> dict[str, Any]:
        evaluator = self.job.evaluator
        t = time.perf_counter()
        out = dict(evaluator(predictor)) if evaluator is not None else {}
        self.times["eval"] += time.perf_counter() - t
        return out

    def evaluate_at_sites(self, state: Any) -> dict[str, Any]:
        """The sites score the method's released final state on their own test
        sets; the server adds up their counts (it holds no test set)."""
        t = time.perf_counter()
        payload = state_to_bytes(self.method.release(state))
        clients = list(range(self.job.num_clients))
        scores, failures = self.transport.evaluate(payload, clients)
        for c, why in failures.items():
            log.warning("site %d did not evaluate the final model: %s", c, why)
        if not scores:
            raise UploadError(f"no site evaluated the final model ({'; '.join(failures.values())})")
        out = merge_site_scores(scores, self.job.run.num_classes)
        out["bytes_down_evaluation"] = len(payload) * len(clients)
        out["warnings"] = [
            *out.get("warnings", []),
            *(f"site {c} did not evaluate the final model: {why}" for c, why in failures.items()),
        ]
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
        kept = self.checkpoints.pending(r) if self.checkpoints is not None else {}
        kept = {c: p for c, p in kept.items() if c in clients}
        if kept:  # accepted before a restart: not asked again
            log.info("round %d: %d upload(s) kept from before the restart", r, len(kept))
            self.transport.restore({c: p.state for c, p in kept.items() if p.state is not None})
        label = f"{method.name}: round {r + 1}/{method.rounds}, clients"
        with job.run.progress.task(label, len(clients) - len(kept)) as task:
            asked = self.transport.exchange(r, [c for c in clients if c not in kept], payload, task)
        t_client = time.perf_counter() - t
        turns = {
            c: asked[c]
            if c in asked
            else ClientTurn(upload=kept[c].upload, state=kept[c].state, warnings=kept[c].warnings)
            for c in clients
        }

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
            warnings={c: list(t.warnings) for c, t in turns.items() if t.warnings},
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
            "%s: resuming after round %d of %d", self.method.name, saved.round, self.method.rounds
        )
        for r in range(saved.round):  # the sampling generator, replayed from the seed
            self.method.sample_clients(r, self.job.num_clients, self.rng)
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
        n_rounds = method.rounds
        bar = job.run.progress.task(f"{method.name}: rounds", n_rounds) if n_rounds > 1 else None
        with torch_threads(self.threads), bar or nullcontext():
            if bar is not None and start:
                bar.advance(start)
            for r in range(start, n_rounds):
                state, record = self.one_round(state, r)
                records.append(record)
                if r < n_rounds - 1:
                    every = job.eval_every
                    if every > 0 and (r + 1) % every == 0 and job.evaluator is not None:
                        record.metrics = self.evaluate(method.predictor(state))
                    obs.on_round_end(r, state, record.as_dict())
                self.save(state, r + 1, records)
                if bar is not None:
                    bar.advance()

        t = time.perf_counter()
        predictor = method.predictor(state)
        self.times["server"] += time.perf_counter() - t
        metrics = (
            self.evaluate_at_sites(state) if job.evaluate_at_clients else self.evaluate(predictor)
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
