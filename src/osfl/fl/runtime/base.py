"""What every runtime shares: the :class:`Job` it carries, the
:class:`RunResult` it returns and the :class:`Runtime` protocol itself.

A runtime carries one method × one seed over one federation (a :class:`Job`)
through its rounds and returns a :class:`RunResult`. The in-process
simulation, Flower on loopback, a Flower deployment (the ServerApp's Grid)
and Flower's simulation engine are runtimes; nothing in a method knows which
one carries it (docs/design.md §1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from osfl.errors import ConfigError

if TYPE_CHECKING:
    from osfl.data.federation import Federation
    from osfl.data.imageset import ImageSet
    from osfl.fl.context import ClientState, RunContext
    from osfl.fl.method import Method, Predictor
    from osfl.fl.observers import Observer

Evaluator = Callable[["Predictor"], Mapping[str, Any]]


class ClientData(Protocol):
    """Each client's training data, by client id (what a client can read).
    ``holds_data``: this process holds every client's data (the simulation,
    a rehearsal), so it knows their labels; a real-sites server does not."""

    holds_data: bool

    @property
    def num_clients(self) -> int: ...

    def data(self, client: int) -> ImageSet: ...

    def size(self, client: int) -> int | None:
        """How many samples the client holds, where the server knows it (a
        rehearsal's partition, a real site's declared size: it bounds the
        client's ``meta.num_samples``), else ``None``."""
        ...

    def node_id(self, client: int) -> int | None:
        """The authenticated node registered to play ``client``, where the
        server knows it (real sites with a site registry), else ``None``."""
        ...


class PartitionedData:
    """The clients of a :class:`~osfl.data.federation.Federation` over one train
    set (simulation and Flower rehearsals): client ``c`` holds
    ``train.subset(federation.client_indices[c])``, built once."""

    holds_data = True

    def __init__(self, train: ImageSet, federation: Federation):
        self.train = train
        self.federation = federation
        self._subsets: dict[int, ImageSet] = {}

    @property
    def num_clients(self) -> int:
        return len(self.federation.client_indices)

    def size(self, client: int) -> int | None:
        if not 0 <= client < self.num_clients:
            return None
        return len(self.federation.client_indices[client])

    def node_id(self, client: int) -> int | None:
        return None  # a rehearsal: every node builds the whole federation

    def data(self, client: int) -> ImageSet:
        if not 0 <= client < self.num_clients:
            raise ConfigError(
                f"client id {client} is outside this federation of {self.num_clients} clients "
                f"(valid: 0..{self.num_clients - 1})"
            )
        if client not in self._subsets:  # np.array: a writable copy of the read-only indices
            indices = np.array(self.federation.client_indices[client])
            self._subsets[client] = self.train.subset(indices)
        return self._subsets[client]


@dataclass
class Job:
    """One method × one seed over one federation: what a runtime carries.

    ``evaluator(predictor) -> metrics`` scores the final predictor on the
    server (and, with ``eval_every > 0``, every ``eval_every`` rounds).
    ``state_dir``: where the round loop saves the server state after every
    round and every accepted upload, and resumes from when it finds them
    there (:mod:`osfl.fl.runtime.checkpoint`); ``None``: nothing is saved.
    ``evaluate_at_clients``: the server holds no test set; the sites score
    the released final model on theirs (:mod:`osfl.fl.runtime.sites`).
    """

    method: Method
    run: RunContext
    clients: ClientData
    seed: int
    evaluator: Evaluator | None = None
    eval_every: int = 0
    state_dir: Path | None = None
    evaluate_at_clients: bool = False

    @property
    def num_clients(self) -> int:
        return self.clients.num_clients


@dataclass
class RoundRecord:
    """What happened in one round (one line of ``events.jsonl``)."""

    round: int
    clients: list[int]
    accepted: list[int]
    refused: dict[int, str]
    bytes_up: int  # accepted uploads (what the ByteCounter and aggregate saw)
    bytes_down: int
    bytes_refused: int  # uploads that arrived but failed validation
    time_client_s: float
    time_server_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: dict[int, list[str]] = field(default_factory=dict)  # client -> its training's
    #: what the server's step logged as a warning (a capped Krum f, ...): server_log.py
    server_warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["refused"] = {str(k): v for k, v in self.refused.items()}
        d["warnings"] = {str(k): v for k, v in self.warnings.items()}
        return d


@dataclass
class RunResult:
    """The outcome of one job: final server state, predictor and its costs."""

    state: Any
    predictor: Predictor
    rounds: list[RoundRecord]
    time_s: dict[str, float]
    bytes_up: int
    bytes_down: int
    metrics: dict[str, Any] = field(default_factory=dict)  # final evaluation, if any
    #: what each client keeps between rounds, where the runtime sees it (in-process clients)
    client_states: dict[int, ClientState] = field(default_factory=dict)

    @property
    def refused(self) -> list[tuple[int, int, str]]:
        return [(r.round, c, why) for r in self.rounds for c, why in r.refused.items()]

    @property
    def warnings(self) -> list[str]:
        """Every client's training warnings, the server step's and the
        evaluation's, one line each."""
        lines = [
            f"client {c} (round {r.round}): {w}"
            for r in self.rounds
            for c, ws in r.warnings.items()
            for w in ws
        ]
        lines += [f"server (round {r.round}): {w}" for r in self.rounds for w in r.server_warnings]
        return lines + [str(w) for w in self.metrics.get("warnings", [])]


class Runtime(Protocol):
    """Carries a :class:`Job` through its rounds (see the module docstring)."""

    name: str

    def execute(self, job: Job, *, observers: Sequence[Observer] = ()) -> RunResult:
        """Run ``job``; observers see every message (docs/design.md §2)."""
        ...
