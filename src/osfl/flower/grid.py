"""The osfl ServerApp side: the shared round loop
(:class:`~osfl.fl.runtime.rounds.RoundLoop`) with Flower's ``Grid`` as the
transport (Flower Message API, ``flwr.serverapp``).

:class:`FlowerGridRuntime` is the runtime of a Flower deployment: it holds the
ServerApp's Grid, maps client ids to nodes (:mod:`osfl.flower.discovery`,
which also checks that every node built the same job and settles which node
plays which site) and sends one message per
client per round (:class:`GridTransport`). Client sampling, validation,
refusals, aggregation order, byte accounting and evaluation are the loop's,
hence the simulation's. A reply that is missing (timeout), an error or
malformed counts as "sent nothing".
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import Context, Message
from flwr.common.logger import update_console_handler
from flwr.serverapp import Grid, ServerApp

from osfl.errors import OsflError, UploadError
from osfl.fl.context import ClientState
from osfl.fl.evaluate import check_client_score
from osfl.fl.observers import Observer
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.rounds import ClientTransport, RoundLoop, refusal
from osfl.fl.runtime.sites import SiteScore
from osfl.flower.claims import Verdict
from osfl.flower.discovery import (
    Bindings,
    DiscoveryError,
    NodesNotConnected,
    discover,
    discover_clients,
    wait_for_nodes,
)
from osfl.flower.records import (
    MSG_EVALUATE,
    MSG_OWN_MODEL,
    MSG_TRAIN,
    Envelope,
    pack,
    read_score,
    unpack,
)
from osfl.flower.spec import JobSpec, job_digest

__all__ = [
    "DiscoveryError",
    "FlowerGridRuntime",
    "GridTransport",
    "NodesNotConnected",
    "discover_clients",
    "make_server_app",
    "wait_for_nodes",
    "with_discovery_notes",
]

#: A client's failure when no node plays it (and discovery said nothing more).
NO_NODE = "no SuperNode connected"

log = logging.getLogger(__name__)


def plain_flower_logs_when_piped() -> None:
    """Flower's logger colours its level names whatever its output is
    (Flower 1.41): off in a process whose stderr is not a terminal (a file, a
    pipe, CI) or under ``NO_COLOR``, so that piped output of ``runtime=flower``,
    SecAgg+ and the engine holds no colour codes. Called on import: every
    osfl runtime over Flower imports this module."""
    try:
        terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        terminal = False
    if not terminal or os.environ.get("NO_COLOR"):
        update_console_handler(colored=False)


plain_flower_logs_when_piped()


def reply_payload(
    reply: Message | None, client: int, round: int, digest: str, timeout: float
) -> Envelope:
    """The envelope of a client's reply (its upload bytes, its notes), or an
    UploadError saying why not."""
    if reply is None:
        raise UploadError(f"no reply within {timeout:.0f} s", client=client)
    if reply.has_error():
        raise UploadError(f"the client failed: {reply.error.reason}", client=client)
    env = unpack(reply.content, client=client)
    if (env.client, env.round, env.job) != (client, round, digest):
        raise UploadError(
            f"reply is for client {env.client}, round {env.round}, job {env.job}; expected "
            f"client {client}, round {round}, job {digest}",
            client=client,
        )
    return env


class RemoteNodes:
    """Transports whose clients are SuperNodes in other processes: each keeps
    its own state in its ``Context.state``, out of the server's reach."""

    def client_states(self) -> dict[int, ClientState]:
        return {}

    def restore(self, states: Mapping[int, bytes]) -> None:
        """Nothing to give back: each SuperNode keeps its own state."""


class GridTransport(RemoteNodes, ClientTransport):
    """One train message per client, sent together; replies in client order.
    ``absent``: why a client without a node has none, where discovery knows
    (its bound node did not answer and an impostor was refused in its place);
    the record says that instead of "no SuperNode connected"."""

    def __init__(
        self,
        grid: Grid,
        nodes: Mapping[int, int],
        digest: str,
        timeout: float,
        num_classes: int,
        absent: Mapping[int, str] | None = None,
    ):
        self.grid, self.nodes, self.digest, self.timeout = grid, dict(nodes), digest, timeout
        self.num_classes, self.absent = num_classes, dict(absent or {})

    def no_node(self, client: int) -> str:
        """Why ``client`` has no node."""
        return self.absent.get(client, NO_NODE)

    def exchange(
        self, round: int, clients: list[int], payload: bytes, task: ProgressTask
    ) -> dict[int, ClientTurn]:
        msgs = [
            Message(
                pack(Envelope(payload, round, c, self.digest)),
                dst_node_id=self.nodes[c],
                message_type=MSG_TRAIN,
                group_id=str(round),
            )
            for c in clients
            if c in self.nodes
        ]
        replies = self.grid.send_and_receive(msgs, timeout=self.timeout) if msgs else []
        by_node = {m.metadata.src_node_id: m for m in replies}
        turns: dict[int, ClientTurn] = {}
        for c in clients:
            if c not in self.nodes:
                turns[c] = ClientTurn(upload=None, state=None, failure=self.no_node(c))
                task.advance()
                continue
            reply = by_node.get(self.nodes[c])
            try:
                env = reply_payload(reply, c, round, self.digest, self.timeout)
                turns[c] = ClientTurn(upload=env.payload, state=None, warnings=env.notes)
            except Exception as e:  # whatever a malformed reply trips: this client sent nothing
                turns[c] = ClientTurn(upload=None, state=None, failure=refusal(c, e))
            task.advance()
        return turns

    def ask_scores(
        self,
        payload: bytes,
        clients: list[int],
        message_type: str,
        read: Callable[[dict[str, Any], int], Any],
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Send ``payload`` to every connected client of ``clients`` as an
        evaluation message and read each reply's score with ``read(score,
        client)``: ``(scores, failures)`` by client (a missing, failed or
        malformed reply is that client's failure only)."""
        sent = [c for c in clients if c in self.nodes]
        msgs = [
            Message(
                pack(Envelope(payload, -1, c, self.digest)),
                dst_node_id=self.nodes[c],
                message_type=message_type,
                group_id="evaluate",
            )
            for c in sent
        ]
        replies = self.grid.send_and_receive(msgs, timeout=self.timeout) if msgs else []
        by_node = {m.metadata.src_node_id: m for m in replies}
        scores: dict[int, Any] = {}
        failures = {c: self.no_node(c) for c in clients if c not in self.nodes}
        for c in sent:
            reply = by_node.get(self.nodes[c])
            try:
                if reply is None:
                    raise UploadError(f"no reply within {self.timeout:.0f} s", client=c)
                if reply.has_error():
                    raise UploadError(f"the node failed: {reply.error.reason}", client=c)
                who, job, score = read_score(reply.content, client=c)
                if (who, job) != (c, self.digest):
                    raise UploadError(f"reply is for client {who}, job {job}", client=c)
                scores[c] = read(score, c)
            except Exception as e:  # a malformed score is that client's failure only
                failures[c] = refusal(c, e)
        return scores, failures

    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]:
        """Every site scores the released final state on its own test set."""
        return self.ask_scores(
            payload,
            clients,
            MSG_EVALUATE,
            lambda score, c: SiteScore.from_meta(score, self.num_classes, c),
        )

    def score_client_models(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        """Every node scores its client's own model (its ``Context.state``
        under the broadcast ``payload``) with its job's evaluator."""
        return self.ask_scores(
            payload,
            clients,
            MSG_OWN_MODEL,
            lambda score, c: check_client_score(score, self.num_classes, len(clients), c),
        )


class FlowerGridRuntime:
    """The runtime of a Flower deployment: the clients are the SuperNodes
    behind ``grid`` (the ServerApp's, or a loopback one). ``threads`` pins this
    process's torch threads during the rounds (clients in this process).
    ``bindings``: which node plays which site besides the job's own registry
    (a rehearsal's site registry, run config ``keep-node``;
    :mod:`osfl.flower.claims`). ``every_node``: a client without a node after
    discovery stops the run (:class:`DiscoveryError`) instead of counting as
    dropped out; Flower's simulation engine sets it, since its every node is
    an actor of this run and a missing one only missed ``node_timeout``."""

    name = "flower"

    def __init__(
        self,
        grid: Grid,
        *,
        round_timeout: float = 600.0,
        node_timeout: float = 120.0,
        threads: int | None = None,
        bindings: Bindings = (),
        every_node: bool = False,
    ):
        self.grid = grid
        self.round_timeout, self.node_timeout, self.threads = round_timeout, node_timeout, threads
        self.bindings = tuple(bindings)
        self.every_node = every_node

    def execute(
        self, job: Job, *, observers: Sequence[Observer] = (), digest: str | None = None
    ) -> RunResult:
        """Discover the nodes and run ``job`` over them; ``digest`` is the one
        the nodes must have built (default: this job's)."""
        job.method.check()
        digest = digest or job_digest(job)
        log.info(
            "osfl ServerApp: method %s, seed %d, %d clients, job %s",
            job.method.name,
            job.seed,
            job.num_clients,
            digest,
        )
        found = discover(self.grid, job, digest, self.node_timeout, self.bindings)
        missing = [c for c in range(job.num_clients) if c not in found.nodes]
        if self.every_node and missing:
            raise DiscoveryError(missing, job.num_clients, [], list(found.absent.values()))
        transport = GridTransport(
            self.grid,
            found.nodes,
            digest,
            self.round_timeout,
            job.run.num_classes,
            absent=found.absent,
        )
        result = RoundLoop(job, transport, observers, threads=self.threads).execute()
        return with_discovery_notes(result, found)


def with_discovery_notes(result: RunResult, found: Verdict) -> RunResult:
    """``result`` whose warnings (hence the record's) begin with discovery's:
    each refused impostor, by node id and partition id. A new metrics dict,
    so the last round's own metrics stay as they were."""
    if not found.refused:
        return result
    notes = [f"discovery: {line}" for line in found.refused]
    result.metrics = {**result.metrics, "warnings": [*notes, *result.metrics.get("warnings", [])]}
    return result


#: The ServerApp's work: ``serve(grid, spec)`` with the spec of the run config.
Serve = Callable[[Grid, JobSpec], Any]


class OneLineOsflErrors(logging.Filter):
    """Flower logs a ServerApp's exception with its whole traceback ("ServerApp
    raised an exception", ``flwr/superlink/runtime/run_serverapp.py``). An
    osfl error is a user's mistake osfl already explains in one line (an
    existing out-dir, a site with a foreign class folder): the log gets that
    line alone, ``osfl: error: ...``; any other exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OsflError):
            record.msg, record.args = "osfl: error: %s", (error,)
            record.exc_info, record.exc_text = None, None
        return True


#: Installed on Flower's logger by every osfl ServerApp (once per process).
ONE_LINE_ERRORS = OneLineOsflErrors()


def make_server_app(serve: Serve, spec: JobSpec | None = None) -> ServerApp:
    """A ServerApp that calls ``serve(grid, spec)`` (default spec: each run's
    run config); its osfl errors reach Flower's log as one line."""
    app = ServerApp()
    flwr_logger = logging.getLogger("flwr")
    if ONE_LINE_ERRORS not in flwr_logger.filters:
        flwr_logger.addFilter(ONE_LINE_ERRORS)

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, spec or JobSpec.from_run_config(context.run_config))

    return app
