"""Observers: cross-cutting concerns that watch every message of a run.

Byte accounting, privacy-audit recording and checkpoints wrap a method rather
than live inside it, as Flower's strategy wrappers do for DP clipping and
secure aggregation (``flwr.serverapp.strategy``; docs/design.md §4). A runtime
calls the hooks of one :class:`Observer` (use :class:`Observers` to fan out to
several) in this order::

    on_run_start(method_name, run)
    for each round r:
        on_broadcast(r, client, broadcast, nbytes)     # once per sampled client
        on_upload(r, client, upload, nbytes, truth)    # once per received upload
        on_round_end(r, state, metrics)                # after aggregate
    on_run_end(result)

``nbytes`` is the exact serialised size of the message (``Message.nbytes``),
computed once by the runtime. ``truth`` (simulation only) is what the client
really did, e.g. ``{"labels": int64 tensor, "num_classes": K}``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from safetensors.torch import save_file

from osfl.errors import ConfigError
from osfl.fl.method import AuditHistory, capability
from osfl.fl.observation import Observation, observe, save_tensors
from osfl.fl.upload import Broadcast, Upload
from osfl.interrupts import atomic_section

if TYPE_CHECKING:
    from osfl.fl.context import RunContext
    from osfl.fl.method import Method

log = logging.getLogger(__name__)


class Observer:
    """Base class: every hook is a no-op; override the ones you need."""

    def on_run_start(self, method_name: str, run: RunContext) -> None:
        """Before round 0."""

    def on_broadcast(self, round: int, client: int, broadcast: Broadcast, nbytes: int) -> None:
        """The server sent ``broadcast`` (``nbytes`` on the wire) to ``client``."""

    def on_upload(
        self,
        round: int,
        client: int,
        upload: Upload,
        nbytes: int,
        truth: Mapping[str, Any] | None = None,
    ) -> None:
        """``client`` sent ``upload``; ``truth`` is the simulation's ground truth."""

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        """After ``aggregate``: the server's new ``state`` and the round's metrics."""

    def on_run_end(self, result: Any) -> None:
        """After the last round."""


class Observers(Observer):
    """Fans every hook out to a list of observers, in order."""

    def __init__(self, observers: Iterable[Observer] = ()):
        self.observers = list(observers)

    def append(self, observer: Observer) -> None:
        self.observers.append(observer)

    def on_run_start(self, method_name: str, run: RunContext) -> None:
        for o in self.observers:
            o.on_run_start(method_name, run)

    def on_broadcast(self, round: int, client: int, broadcast: Broadcast, nbytes: int) -> None:
        for o in self.observers:
            o.on_broadcast(round, client, broadcast, nbytes)

    def on_upload(
        self,
        round: int,
        client: int,
        upload: Upload,
        nbytes: int,
        truth: Mapping[str, Any] | None = None,
    ) -> None:
        for o in self.observers:
            o.on_upload(round, client, upload, nbytes, truth)

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        for o in self.observers:
            o.on_round_end(round, state, metrics)

    def on_run_end(self, result: Any) -> None:
        for o in self.observers:
            o.on_run_end(result)


class ByteCounter(Observer):
    """Exact bytes down (broadcasts) and up (uploads), per round and per client."""

    def __init__(self) -> None:
        # down[round][client] / up[round][client]: bytes (summed if a client sends twice)
        self.down: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.up: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def on_broadcast(self, round: int, client: int, broadcast: Broadcast, nbytes: int) -> None:
        self.down[round][client] += int(nbytes)

    def on_upload(
        self,
        round: int,
        client: int,
        upload: Upload,
        nbytes: int,
        truth: Mapping[str, Any] | None = None,
    ) -> None:
        self.up[round][client] += int(nbytes)

    @property
    def total_up(self) -> int:
        return sum(sum(c.values()) for c in self.up.values())

    @property
    def total_down(self) -> int:
        return sum(sum(c.values()) for c in self.down.values())

    def per_round(self, direction: str = "up") -> dict[int, int]:
        """Bytes per round in ``direction`` ("up" or "down")."""
        table = self._table(direction)
        return {r: sum(c.values()) for r, c in sorted(table.items())}

    def per_client(self, direction: str = "up") -> dict[int, int]:
        """Bytes per client summed over rounds in ``direction`` ("up" or "down")."""
        out: dict[int, int] = defaultdict(int)
        for clients in self._table(direction).values():
            for c, n in clients.items():
                out[c] += n
        return dict(sorted(out.items()))

    def _table(self, direction: str) -> dict[int, dict[int, int]]:
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        return self.up if direction == "up" else self.down

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (string keys) for metrics.json."""
        return {
            "bytes_up": self.total_up,
            "bytes_down": self.total_down,
            "bytes_up_per_round": {str(r): n for r, n in self.per_round("up").items()},
            "bytes_down_per_round": {str(r): n for r, n in self.per_round("down").items()},
            "bytes_up_per_client": {str(c): n for c, n in self.per_client("up").items()},
            "bytes_down_per_client": {str(c): n for c, n in self.per_client("down").items()},
        }


class ObservationRecorder(Observer):
    """Turns broadcast + upload (+ truth, + the scheme history) into
    :class:`Observation` objects (built by :func:`~osfl.fl.observation.observe`).

    Keeps them in ``observations`` and, when ``dir`` is given, writes each to
    ``dir/round_RRR/client_CCC/`` with the round's broadcast stored once in
    ``dir/round_RRR/broadcast.safetensors`` when all its clients got the same
    one. ``clients`` / ``rounds`` restrict what is recorded (audits usually
    look at a few clients; recording every client of a long run is costly).
    ``hparams`` are the public training hyper-parameters; ``None`` takes
    ``run.train.public_hparams()`` and the method name at ``on_run_start``.
    ``method``: its :meth:`~osfl.fl.method.Method.audit_history` of the server
    state after round ``r - 1`` is what the server knows of a client at the
    start of round ``r`` (the Observation's ``history``; round 0 has none).
    """

    def __init__(
        self,
        hparams: Mapping[str, Any] | None = None,
        dir: str | Path | None = None,
        clients: Iterable[int] | None = None,
        rounds: Iterable[int] | None = None,
        method: Method | None = None,
    ):
        self.hparams = dict(hparams) if hparams is not None else None
        self.dir = Path(dir) if dir is not None else None
        self.clients = None if clients is None else set(clients)
        self.rounds = None if rounds is None else set(rounds)
        self.method = method
        self.observations: list[Observation] = []
        self._broadcasts: dict[tuple[int, int], Broadcast] = {}
        self._shared: dict[int, dict[str, torch.Tensor]] = {}
        self._state: Any = None

    def _wanted(self, round: int, client: int) -> bool:
        return (self.rounds is None or round in self.rounds) and (
            self.clients is None or client in self.clients
        )

    def on_run_start(self, method_name: str, run: RunContext) -> None:
        if self.hparams is None:
            self.hparams = {"method": method_name, **run.train.public_hparams()}

    def on_broadcast(self, round: int, client: int, broadcast: Broadcast, nbytes: int) -> None:
        if self._wanted(round, client):
            self._broadcasts[(round, client)] = broadcast

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        self._state = state  # aggregate returns a new state: safe to hold

    def prepare_truth(self, truth: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The truth stored with an Observation (subclasses refine it)."""
        return None if truth is None else dict(truth)

    def on_upload(
        self,
        round: int,
        client: int,
        upload: Upload,
        nbytes: int,
        truth: Mapping[str, Any] | None = None,
    ) -> None:
        if not self._wanted(round, client):
            return
        received = self._broadcasts.pop((round, client), None)
        tensors, shared = self._round_broadcast(round, received)
        history = {}
        auditable = capability(self.method, AuditHistory) if self.method is not None else None
        if auditable is not None and self._state is not None:
            history = auditable.audit_history(self._state, client, upload.meta)
        obs = observe(
            client,
            round,
            broadcast=tensors,
            upload=upload.tensors,
            upload_meta=upload.meta,
            hparams=self.hparams,
            truth=self.prepare_truth(truth),
            history=history,
        )
        self.observations.append(obs)
        if self.dir is not None:
            self._save(self.dir, obs, shared)

    def _round_broadcast(
        self, round: int, received: Broadcast | None
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """The client's broadcast tensors and whether they equal the round's shared one.

        Runtimes hand each client its own parsed copy; equal copies are replaced
        by the round's first one, so memory and disk hold one broadcast per round.
        """
        if received is None:
            return {}, False
        tensors = {k: v.detach().to("cpu") for k, v in received.tensors.items()}
        first = self._shared.get(round)
        if first is None:
            self._shared[round] = tensors
            return tensors, True
        if _equal_tensors(first, tensors):
            return first, True
        return tensors, False

    def _save(self, root: Path, obs: Observation, shared: bool) -> None:
        round_dir = root / f"round_{obs.round:03d}"
        client_dir = round_dir / f"client_{obs.client_id:03d}"
        if not shared:  # a personalised broadcast (or none): the client's own copy
            obs.save(client_dir)
            return
        path = round_dir / "broadcast.safetensors"
        if not path.exists():
            round_dir.mkdir(parents=True, exist_ok=True)
            save_tensors(obs.broadcast, path)
        obs.save(client_dir, broadcast_path=path)

    def for_client(self, client: int) -> list[Observation]:
        return [o for o in self.observations if o.client_id == client]


def _equal_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


def _flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a (nested) mapping, keys joined with '.', non-tensors skipped."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            out[name] = v
        elif isinstance(v, Mapping):
            out.update(_flat_tensors(v, name + "."))
    return out


@runtime_checkable
class HasStateDict(Protocol):
    """A server state that flattens itself into tensors (e.g. ``SchemeState``)."""

    def state_dict(self) -> Mapping[str, torch.Tensor]: ...


#: The safetensors header key of a round checkpoint's ``{"round", "metrics"}``.
CHECKPOINT_KEY = "osfl_round"


class Checkpointer(Observer):
    """Saves the server state every ``every`` rounds as ``dir/round_RRR.safetensors``.

    The state is saved when it is a (nested) mapping of tensors or has
    ``state_dict()``; otherwise the round is skipped with a debug log. The
    round and its metrics ride along as one JSON object under
    :data:`CHECKPOINT_KEY` in the safetensors header, so that identical runs
    keep byte-identical files.
    """

    def __init__(self, dir: str | Path, every: int = 1):
        if every < 1:
            raise ConfigError(f"Checkpointer every must be >= 1, got {every}")
        self.dir = Path(dir)
        self.every = every
        self.saved: list[Path] = []

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        if (round + 1) % self.every:
            return
        if isinstance(state, HasStateDict):
            state = state.state_dict()
        if not isinstance(state, Mapping):
            log.debug("round %d: state %s has no tensors to checkpoint", round, type(state))
            return
        tensors = _flat_tensors(state)
        if not tensors:
            log.debug("round %d: state holds no tensors to checkpoint", round)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"round_{round:03d}.safetensors"
        tmp = path.with_suffix(".tmp")
        # one header key: safetensors writes a map of several in a per-process
        # order, so two identical runs would keep files that differ byte-wise
        record = {"round": round, "metrics": dict(metrics)}
        meta = {CHECKPOINT_KEY: json.dumps(record, default=str, sort_keys=True)}
        cpu = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
        with atomic_section():  # Ctrl-C waits for the rename: never half a checkpoint
            save_file(cpu, str(tmp), metadata=meta)
            tmp.replace(path)
        self.saved.append(path)
