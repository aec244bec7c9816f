"""The osfl ServerApp side: the shared round loop
(:class:`~osfl.fl.runtime.rounds.RoundLoop`) with Flower's ``Grid`` as the
transport (Flower Message API, ``flwr.serverapp``).

:class:`FlowerGridRuntime` is the runtime of a Flower deployment: it holds the
ServerApp's Grid, maps client ids to nodes (:func:`discover_clients`, which
also checks that every node built the same job) and sends one message per
client per round (:class:`GridTransport`). Client sampling, validation,
refusals, aggregation order, byte accounting and evaluation are the loop's,
hence the simulation's. A reply that is missing (timeout), an error or
malformed counts as "sent nothing".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from osfl.errors import ConfigError, OsflError, UploadError
from osfl.fl.context import ClientState
from osfl.fl.evaluate import check_client_score
from osfl.fl.observers import Observer
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.rounds import ClientTransport, RoundLoop, refusal
from osfl.fl.runtime.sites import SiteScore
from osfl.flower.client import ERROR_CLIENT_FAILED
from osfl.flower.records import (
    MSG_EVALUATE,
    MSG_OWN_MODEL,
    MSG_TRAIN,
    MSG_WHOAMI,
    Envelope,
    pack,
    read_score,
    read_whoami,
    unpack,
    whoami_query,
)
from osfl.flower.spec import JobSpec, job_digest, job_parts

log = logging.getLogger(__name__)


class NodesNotConnected(OsflError):
    """Fewer than the needed nodes connected in time. The hint is for a
    deployment (start the SuperNodes); Flower's simulation engine, whose nodes
    osfl registers itself, rephrases it (:mod:`osfl.flower.engine`)."""

    def __init__(self, connected: int, count: int, need: int, timeout: float):
        self.connected, self.count, self.need, self.timeout = connected, count, need, timeout
        super().__init__(
            f"only {connected} of {count} SuperNodes connected within {timeout:.0f} s "
            f"(at least {need} needed): start one flower-supernode per client "
            "(--node-config 'partition-id=<i>'), or raise the run config 'node-timeout'"
        )


def wait_for_nodes(
    grid: Grid,
    count: int,
    timeout: float,
    poll: float = 0.5,
    at_least: int | None = None,
    registered: frozenset[int] = frozenset(),
) -> list[int]:
    """The connected node ids once ``count`` are connected (every one of the
    ``registered`` nodes among them, when the server knows which they are), or,
    when ``timeout`` passes, once at least ``at_least`` (default ``count``) are."""
    deadline = time.monotonic() + timeout
    need = count if at_least is None else at_least
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count and registered <= set(nodes):
            return nodes
        if time.monotonic() > deadline:
            if len(nodes) >= need:
                return nodes
            raise NodesNotConnected(len(nodes), count, need, timeout)
        time.sleep(poll)


class DiscoveryError(ConfigError):
    """Discovery found no usable node for some clients: ``problems`` are the
    nodes that answered and refused the job (a misconfigured site: its own
    reason says what to fix), ``gone`` the ones Flower could not reach.

    Only when no node refused does the message add how to start the missing
    SuperNodes; a refusal's reason is the whole story, and the same reason
    from many nodes is said once. Flower's simulation engine rephrases it
    (:mod:`osfl.flower.engine`: its ClientApps are Ray actors, not
    SuperNodes a user starts)."""

    def __init__(self, missing: list[int], num_clients: int, problems: list[str], gone: list[str]):
        self.missing, self.num_clients = missing, num_clients
        self.problems, self.gone = problems, gone
        if problems:
            super().__init__(
                f"client(s) {missing} of {num_clients} have no usable node: {self.reasons()}"
            )
        else:
            super().__init__(
                f"no usable SuperNode for client(s) {missing} of {num_clients} "
                f"({self.reasons() or 'no node answered for them'}); start one "
                "flower-supernode per client with --node-config 'partition-id=<i>'"
            )

    def reasons(self) -> str:
        """Each distinct reason once, with the nodes that gave it."""
        by_reason: dict[str, list[str]] = {}
        for item in [*self.problems, *self.gone]:
            who, sep, why = item.partition(": ")
            why = (why if sep else item).strip().splitlines()[0] if item.strip() else "?"
            by_reason.setdefault(why, []).append(who if sep else "")
        parts = []
        for why, whos in by_reason.items():
            named = [w for w in whos if w]
            if len(named) > 3:  # Flower's node ids are long random numbers
                parts.append(f"{len(named)} nodes: {why}")
            elif len(named) > 1:
                parts.append(f"nodes {', '.join(w.removeprefix('node ') for w in named)}: {why}")
            else:
                parts.append(f"{named[0]}: {why}" if named else why)
        return "; ".join(parts)


def discover_clients(grid: Grid, job: Job, digest: str, timeout: float) -> dict[int, int]:
    """Map client id -> node id by asking every node for its ``partition-id``.

    The query carries the server's job digest and parts; a node whose own job
    differs (another config, data or osfl version) answers with an error that
    names the differing parts, and the run stops here rather than mid-way.
    Where the server knows which authenticated node was registered for each
    client (``job.clients.node_id``: a site registry), a node that claims
    another node's partition id is refused and logged as an impostor, whatever
    the order of the answers.
    """
    need = job.run.server.min_clients
    registered = {c: job.clients.node_id(c) for c in range(job.num_clients)}
    known = frozenset(n for n in registered.values() if n is not None)
    nodes = wait_for_nodes(grid, job.num_clients, timeout, at_least=need, registered=known)
    query = whoami_query(digest, job_parts(job))
    msgs = [Message(query, dst_node_id=n, message_type=MSG_WHOAMI) for n in nodes]
    mapping: dict[int, int] = {}
    problems: list[str] = []
    gone: list[str] = []
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error() and reply.error.code != ERROR_CLIENT_FAILED:
            gone.append(f"node {node}: {reply.error.reason}")  # Flower's: unreachable, dropped
            continue
        if reply.has_error():  # the node's osfl refused the job: a misconfigured site
            problems.append(f"node {node}: {reply.error.reason}")
            continue
        try:
            cid, theirs = read_whoami(reply.content)
        except Exception as e:  # a malformed answer: that node cannot be used
            problems.append(f"node {node}: {type(e).__name__}: {e}")
            continue
        owner = registered.get(cid)
        if owner is not None and node != owner:
            log.error(
                "node %d claims partition-id %d, which is registered to node %d: refused",
                node,
                cid,
                owner,
            )
            continue
        if theirs != digest:
            problems.append(f"node {node} (partition-id {cid}) built job {theirs}, not {digest}")
        elif cid in mapping:
            problems.append(f"nodes {mapping[cid]} and {node} both claim partition-id {cid}")
        else:
            mapping[cid] = node
    missing = [c for c in range(job.num_clients) if c not in mapping]
    if len(mapping) < need or (problems and missing):  # a misconfigured site stops the run
        raise DiscoveryError(missing, job.num_clients, problems, gone)
    if missing:  # not connected in time or unreachable: the rounds go on without them
        log.warning(
            "no SuperNode for client(s) %s: they count as dropped out (%s)",
            missing,
            "; ".join(gone) or "not connected",
        )
    if problems:  # every client has its node: a stray extra node is only logged
        log.warning("SuperNode(s) not used: %s", "; ".join(problems))
    log.info("discovery: client(s) %s answered", sorted(mapping))
    return mapping


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
    """One train message per client, sent together; replies in client order."""

    def __init__(
        self, grid: Grid, nodes: Mapping[int, int], digest: str, timeout: float, num_classes: int
    ):
        self.grid, self.nodes, self.digest, self.timeout = grid, dict(nodes), digest, timeout
        self.num_classes = num_classes

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
                turns[c] = ClientTurn(upload=None, state=None, failure="no SuperNode connected")
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
        failures = {c: "no SuperNode connected" for c in clients if c not in self.nodes}
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
    process's torch threads during the rounds (clients in this process)."""

    name = "flower"

    def __init__(
        self,
        grid: Grid,
        *,
        round_timeout: float = 600.0,
        node_timeout: float = 120.0,
        threads: int | None = None,
    ):
        self.grid = grid
        self.round_timeout, self.node_timeout, self.threads = round_timeout, node_timeout, threads

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
        nodes = discover_clients(self.grid, job, digest, self.node_timeout)
        transport = GridTransport(self.grid, nodes, digest, self.round_timeout, job.run.num_classes)
        return RoundLoop(job, transport, observers, threads=self.threads).execute()


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
