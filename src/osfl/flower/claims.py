"""Which node plays which site: the server's verdict on the ``partition-id``
every node claimed at discovery.

A node says which client it plays in its own node config, so a claim is only
a claim. What the server trusts instead is what the operator told it — the
site registry (run config ``site-registry``: each site's registered node id)
and run config ``keep-node`` (the node to keep for a partition id two nodes
claim) — and never the order of the answers:

- a node claiming a partition id bound to another node is an **impostor**:
  refused, named in the record, and the run goes on with the bound node;
- a node bound to one partition id that claims another is a **mismatch**
  between the operator's bindings and the connected nodes (a typo that swaps
  two node ids, a site started with the wrong ``partition-id``): the run
  stops before any site trains, naming the node ids and partition ids;
- two unbound nodes claiming one partition id are a **duplicate claim**: the
  run stops, naming both nodes, unless ``keep-node`` says which to keep.

Everything here names nodes and partition ids only (integers), and every list
is cut at :data:`MAX_LISTED` items, so a flood of hostile claims cannot grow
a message or the record without bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from osfl.errors import ConfigError

__all__ = [
    "KEEP_NODE",
    "MAX_LISTED",
    "REGISTRY",
    "Binding",
    "Claim",
    "ClaimsMismatch",
    "Verdict",
    "bind",
    "listing",
    "settle",
]

#: How the sources of a binding are named in messages.
REGISTRY = "the site registry"
KEEP_NODE = "run config keep-node"

#: The most items a message lists (then "and N more").
MAX_LISTED = 6


class Binding(NamedTuple):
    """The node the operator bound a partition id to, and where they said so."""

    node: int
    source: str


class Claim(NamedTuple):
    """One node's answer at discovery: the partition id it says it plays."""

    node: int
    partition_id: int


class ClaimsMismatch(ConfigError):
    """The connected nodes' claims cannot be settled without the operator:
    a node bound to one partition id claims another, or two unbound nodes
    claim one partition id. Raised before any site trains."""


@dataclass
class Verdict:
    """The outcome of discovery's claims: ``nodes`` (client -> node) to run
    with, ``refused`` impostors (one line each, for the log and the record)
    and, for a client whose slot only an impostor claimed, why it has no node."""

    nodes: dict[int, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    absent: dict[int, str] = field(default_factory=dict)


def listing(items: Sequence[str], most: int = MAX_LISTED) -> str:
    """``items`` joined by "; ", at most ``most`` of them."""
    shown = "; ".join(items[:most])
    return shown + (f"; and {len(items) - most} more" if len(items) > most else "")


def bind(num_clients: int, sources: Iterable[tuple[str, Mapping[int, int]]]) -> dict[int, Binding]:
    """Partition id -> :class:`Binding` from each ``(source name, {partition
    id: node id})``; a source that names a partition id outside the
    federation, or two sources (or one) that disagree, is a ConfigError."""
    out: dict[int, Binding] = {}
    for source, nodes in sources:
        for pid, node in sorted(nodes.items()):
            if not 0 <= pid < num_clients:
                raise ConfigError(
                    f"{source} names partition-id {pid}; the run has {num_clients} sites "
                    f"(0..{num_clients - 1})"
                )
            have = out.get(pid)
            if have is not None and have.node != node:
                raise ConfigError(
                    f"{have.source} binds partition-id {pid} to node {have.node}, {source} to "
                    f"node {node}: keep one"
                )
            out.setdefault(pid, Binding(node, source))
    seen: dict[int, int] = {}
    for pid, b in sorted(out.items()):
        if b.node in seen:
            raise ConfigError(
                f"node {b.node} is bound to partition-ids {seen[b.node]} and {pid} "
                f"({b.source}): one node plays one site"
            )
        seen[b.node] = pid
    return out


def settle(claims: Sequence[Claim], bound: Mapping[int, Binding]) -> Verdict:
    """The verdict on ``claims`` (see the module docstring); a
    :class:`ClaimsMismatch` when the operator must decide. The answers'
    order never matters: claimants are taken in node-id order."""
    role = {b.node: (pid, b.source) for pid, b in bound.items()}
    by_pid: dict[int, set[int]] = {}
    for claim in claims:
        by_pid.setdefault(claim.partition_id, set()).add(claim.node)
    verdict, mismatches, duplicates = Verdict(), [], []
    misbound: set[str] = set()  # the sources a mismatched node was bound by
    impostors: dict[int, list[int]] = {}
    for pid in sorted(by_pid):
        free = _free_claimants(pid, sorted(by_pid[pid]), role, mismatches, misbound)
        binding = bound.get(pid)
        if binding is not None:
            impostors[pid] = _keep_bound(pid, free, binding, verdict)
        elif len(free) > 1:
            duplicates.append(_claimants(free, pid))
        elif free:
            verdict.nodes[pid] = free[0]
    if mismatches or duplicates:
        raise ClaimsMismatch(_mismatch_text(mismatches, duplicates, sorted(misbound)))
    _note_absent(verdict, impostors, bound)
    verdict.refused = verdict.refused[:MAX_LISTED] + (
        [f"and {len(verdict.refused) - MAX_LISTED} more impostor(s) refused"]
        if len(verdict.refused) > MAX_LISTED
        else []
    )
    return verdict


def _free_claimants(
    pid: int,
    nodes: Sequence[int],
    role: Mapping[int, tuple[int, str]],
    mismatches: list[str],
    misbound: set[str],
) -> list[int]:
    """The claimants of ``pid`` not bound to another partition id; each
    node that is (a mismatch the operator must correct) is added to
    ``mismatches`` and its binding's source to ``misbound``."""
    free = []
    for node in nodes:
        own = role.get(node)
        if own is not None and own[0] != pid:
            misbound.add(own[1])
            mismatches.append(
                f"node {node} is partition-id {own[0]} in {own[1]} but claims partition-id {pid}"
            )
        else:
            free.append(node)
    return free


def _keep_bound(pid: int, free: Sequence[int], binding: Binding, verdict: Verdict) -> list[int]:
    """Give a bound ``pid`` to its bound node if it claimed it, refuse every
    other claimant as an impostor; returns the impostors."""
    if binding.node in free:
        verdict.nodes[pid] = binding.node
    impostors = [n for n in free if n != binding.node]
    for node in impostors:
        verdict.refused.append(
            f"node {node} claims partition-id {pid}, which {binding.source} gives node "
            f"{binding.node}: refused as an impostor"
        )
    return impostors


def _note_absent(
    verdict: Verdict, impostors: Mapping[int, list[int]], bound: Mapping[int, Binding]
) -> None:
    """A bound site whose node did not answer while impostors claimed it is
    absent, with the reason: the run goes on without it, never with them."""
    for pid, nodes in impostors.items():
        if nodes and pid not in verdict.nodes:
            verdict.absent[pid] = (
                f"its node {bound[pid].node} ({bound[pid].source}) did not answer; "
                f"node(s) {listing([str(n) for n in nodes])} claimed it and were refused "
                "as impostors"
            )


def _mismatch_text(
    mismatches: Sequence[str], duplicates: Sequence[str], sources: Sequence[str]
) -> str:
    """One line: what disagrees, and what the operator can do about it."""
    parts = []
    if mismatches:
        parts.append(
            f"{' and '.join(sources)} and the connected nodes disagree: "
            f"{listing(mismatches)}: correct the node ids there (flwr supernode ls) "
            "or the nodes' partition-id"
        )
    if duplicates:
        parts.append(
            f"{listing(duplicates)}: nothing says which node is the site (the first to "
            "answer never decides); stop the other node, give a site registry "
            "(run config 'site-registry') or name the node to keep "
            '(run config keep-node="<partition-id>=<node id>")'
        )
    return "; also ".join(parts)


def _claimants(nodes: Sequence[int], pid: int) -> str:
    """``nodes A and B both claim partition-id P`` (at most :data:`MAX_LISTED` named)."""
    if len(nodes) == 2:
        return f"nodes {nodes[0]} and {nodes[1]} both claim partition-id {pid}"
    named = ", ".join(map(str, nodes[:MAX_LISTED]))
    more = f" and {len(nodes) - MAX_LISTED} more" if len(nodes) > MAX_LISTED else ""
    return f"{len(nodes)} nodes ({named}{more}) claim partition-id {pid}"
