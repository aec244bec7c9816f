"""Before round 0: which SuperNode plays which client (:func:`discover`).

The server waits for the nodes, asks each for its ``partition-id`` and the
digest of the job it built, and settles the claims
(:mod:`osfl.flower.claims`): a node whose job differs, or that refuses the
job, is a misconfigured site and stops the run; an impostor is refused and
named in the record; a mismatch between the operator's bindings and the
nodes, or two unbound nodes claiming one partition id, stops the run. Every
reply is a peer's: its fields are checked and what it says is cut short
before it reaches a message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from flwr.app import Message
from flwr.serverapp import Grid

from osfl.errors import ConfigError, OsflError
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.rounds import MAX_REASON_CHARS
from osfl.flower.claims import REGISTRY, Claim, Verdict, bind, settle
from osfl.flower.client import ERROR_CLIENT_FAILED
from osfl.flower.records import MSG_WHOAMI, read_whoami, whoami_query
from osfl.flower.spec import job_parts

__all__ = [
    "Bindings",
    "DiscoveryError",
    "NodesNotConnected",
    "discover",
    "discover_clients",
    "wait_for_nodes",
]

log = logging.getLogger(__name__)

#: What the operator bound, besides the job's own registry: ``(source name,
#: {partition id: node id})`` pairs (:func:`osfl.flower.claims.bind`).
Bindings = Sequence[tuple[str, Mapping[int, int]]]


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


def _short(text: str) -> str:
    """A peer's words, cut to :data:`MAX_REASON_CHARS`."""
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


def _ask(
    grid: Grid, job: Job, digest: str, nodes: list[int], timeout: float
) -> tuple[list[Claim], list[str], list[str]]:
    """Every node's claim ``(claims, problems, gone)``: ``problems`` the nodes
    that refused or built another job, or claimed no partition id of this
    run; ``gone`` the ones Flower could not reach."""
    query = whoami_query(digest, job_parts(job))
    msgs = [Message(query, dst_node_id=n, message_type=MSG_WHOAMI) for n in nodes]
    claims: list[Claim] = []
    problems: list[str] = []
    gone: list[str] = []
    asked, answered = set(nodes), set[int]()
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        node = reply.metadata.src_node_id
        if node in answered or node not in asked:  # one question, one answer
            problems.append(f"node {node} answered twice or unasked")
            continue
        answered.add(node)
        if reply.has_error() and reply.error.code != ERROR_CLIENT_FAILED:
            gone.append(f"node {node}: {_short(str(reply.error.reason))}")  # unreachable, dropped
            continue
        if reply.has_error():  # the node's osfl refused the job: a misconfigured site
            problems.append(f"node {node}: {_short(str(reply.error.reason))}")
            continue
        try:
            cid, theirs = read_whoami(reply.content)
        except Exception as e:  # a malformed answer: that node cannot be used
            problems.append(f"node {node}: {type(e).__name__}: {_short(str(e))}")
            continue
        if not 0 <= cid < job.num_clients:
            problems.append(
                f"node {node} claims partition-id {cid}, outside this run's "
                f"0..{job.num_clients - 1}"
            )
        elif theirs != digest:
            problems.append(
                f"node {node} (partition-id {cid}) built job {_short(theirs)}, not {digest}"
            )
        else:
            claims.append(Claim(node, cid))
    return claims, problems, gone


def discover(grid: Grid, job: Job, digest: str, timeout: float, bindings: Bindings = ()) -> Verdict:
    """Map client id -> node id by asking every node for its ``partition-id``.

    The query carries the server's job digest and parts; a node whose own job
    differs (another config, data or osfl version) answers with an error that
    names the differing parts, and the run stops here rather than mid-way.
    What the operator bound — the job's site registry (``job.clients.node_id``)
    and ``bindings`` (a rehearsal's registry, run config ``keep-node``) —
    settles the claims (:func:`osfl.flower.claims.settle`), whatever the order
    of the answers. Refused impostors are logged and come back in
    ``Verdict.refused`` for the record.
    """
    need = job.run.server.min_clients
    own = {c: job.clients.node_id(c) for c in range(job.num_clients)}
    bound = bind(
        job.num_clients,
        [(REGISTRY, {c: n for c, n in own.items() if n is not None}), *bindings],
    )
    known = frozenset(b.node for b in bound.values())
    nodes = wait_for_nodes(grid, job.num_clients, timeout, at_least=need, registered=known)
    claims, problems, gone = _ask(grid, job, digest, nodes, timeout)
    verdict = settle(claims, bound)
    for line in verdict.refused:
        log.warning("discovery: %s", line)
    missing = [c for c in range(job.num_clients) if c not in verdict.nodes]
    if len(verdict.nodes) < need or (problems and missing):  # a misconfigured site stops it
        raise DiscoveryError(missing, job.num_clients, problems, gone)
    if missing:  # not connected in time or unreachable: the rounds go on without them
        log.warning(
            "no SuperNode for client(s) %s: they count as dropped out (%s)",
            missing,
            "; ".join([*verdict.absent.values(), *gone]) or "not connected",
        )
    if problems:  # every client has its node: a stray extra node is only logged
        log.warning("SuperNode(s) not used: %s", "; ".join(problems))
    log.info("discovery: client(s) %s answered", sorted(verdict.nodes))
    return verdict


def discover_clients(
    grid: Grid, job: Job, digest: str, timeout: float, bindings: Bindings = ()
) -> dict[int, int]:
    """Client id -> node id (:func:`discover` without its notes)."""
    return discover(grid, job, digest, timeout, bindings).nodes
