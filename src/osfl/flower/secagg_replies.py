"""The server's side of each SecAgg+ message (:mod:`osfl.flower.secagg_server`):
the Grid the workflow talks through, which checks every reply for the form
its stage needs before Flower reads it, and counts the bytes.

Flower's ``SecAggPlusWorkflow``
(``flwr/server/workflow/secure_aggregation/secaggplus_workflow.py``) trusts
its replies; a malformed one would crash the server. Here it becomes an
error reply, i.e. a dropout of that client (Bell et al., ACM CCS 2020,
Algorithm 2, tolerates dropouts up to its threshold), never the round's end.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Error, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.compat.common.parameter import bytes_to_ndarray
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.run import Run

from osfl import jsonio
from osfl.fl.secagg_config import Layout, SecureKey, layout_digest
from osfl.flower.client import ERROR_CLIENT_FAILED

log = logging.getLogger(__name__)


def message_nbytes(message: Message) -> int:
    """``message``'s bytes as Flower puts it on the wire (its deflated objects)."""
    return sum(len(o.deflate()) for o in get_all_nested_objects(message).values())


def _list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(type(v) is kind for v in value)


class ProtocolGrid(Grid):
    """The ServerApp's Grid as the workflow sees it: each reply is checked for
    the form its stage needs before Flower reads it (a malformed one becomes an
    error reply, i.e. a dropout, never a server crash) and every message is
    counted. The workflow only calls ``send_and_receive``."""

    def __init__(
        self,
        grid: Grid,
        clients: Mapping[int, int],
        check_vector: Callable[[Message, int], str | None],
        timeout: float,
    ):
        self.grid, self.clients, self.check_vector = grid, dict(clients), check_vector
        self.timeout = timeout
        self.dropped: dict[int, str] = {}
        self.bytes_up = dict.fromkeys(self.clients.values(), 0)
        self.bytes_down = dict.fromkeys(self.clients.values(), 0)

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("the SecAgg+ workflow only calls send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("the SecAgg+ workflow only calls send_and_receive")

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        batch = {m.metadata.dst_node_id: m for m in messages}
        if not batch:
            return []
        first = next(iter(batch.values()))
        stage = str(first.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])
        for node, m in batch.items():
            self.bytes_down[self.clients[node]] += message_nbytes(m)
        out = []
        for reply in self.grid.send_and_receive(list(batch.values()), timeout=timeout):
            node = reply.metadata.src_node_id
            if node not in batch:
                continue
            client = self.clients[node]
            self.bytes_up[client] += message_nbytes(reply)
            why = reply.error.reason if reply.has_error() else self.problem(stage, reply, client)
            if why is not None:
                self.dropped.setdefault(client, f"SecAgg+ stage {stage!r}: {why}")
                log.warning("SecAgg+: client %d dropped at stage %s: %s", client, stage, why)
                reply = Message(Error(ERROR_CLIENT_FAILED, why), reply_to=batch[node])
            out.append(reply)
        for node in batch.keys() - {r.metadata.src_node_id for r in out}:
            why = f"SecAgg+ stage {stage!r}: no reply within {self.timeout:.0f} s"
            self.dropped.setdefault(self.clients[node], why)
        return out

    def problem(self, stage: str, reply: Message, client: int) -> str | None:
        """Why ``reply`` lacks the form the workflow reads in ``stage``."""
        rec = reply.content.config_records.get(RECORD_KEY_CONFIGS)
        if rec is None:
            return f"the reply lacks the {RECORD_KEY_CONFIGS!r} record"
        if stage == Stage.SETUP:
            keys = (rec.get(Key.PUBLIC_KEY_1), rec.get(Key.PUBLIC_KEY_2))
            return None if all(isinstance(k, bytes) for k in keys) else "no public keys"
        pairs = {
            Stage.SHARE_KEYS: (Key.DESTINATION_LIST, Key.CIPHERTEXT_LIST),
            Stage.UNMASK: (Key.NODE_ID_LIST, Key.SHARE_LIST),
        }
        if stage in pairs:
            nodes, blobs = (rec.get(k) for k in pairs[stage])
            ok = _list_of(nodes, int) and _list_of(blobs, bytes) and len(nodes) == len(blobs)
            return None if ok and set(nodes) <= set(self.clients) else "malformed key shares"
        return self.check_vector(reply, client)


def vector_problem(
    reply: Message, client: int, round: int, job: str, layout: Layout, max_count: int
) -> tuple[str | None, int, tuple[str, ...]]:
    """``(why, weight, notes)`` of a masked-vector reply, checked before
    Flower sums it: its clear-text envelope (round, client, job, layout
    digest), its weight against what the server accepts, no array left in
    clear, one masked integer array per tensor (plus the weight) of the
    layout's shape."""
    try:
        res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    except (KeyError, TypeError) as e:
        return f"not a FitRes reply ({e})", 0, ()
    m = res.metrics
    why = _envelope_problem(m, (client, round, job), layout)
    if why is not None:
        return why, 0, ()
    n = res.num_examples
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= max_count:
        return f"weight (num_examples) {n!r} lies outside [1, {max_count}]", 0, ()
    why = _masked_problem(reply, layout)
    if why is not None:
        return why, 0, ()
    return None, n, _notes(m)


def _envelope_problem(
    metrics: Mapping[str, Any], expected: tuple[int, int, str], layout: Layout
) -> str | None:
    """Why the clear-text envelope is not this round's: another client,
    round or job (a replayed or misrouted reply), or another upload spec."""
    got = tuple(metrics.get(k) for k in (SecureKey.CLIENT, SecureKey.ROUND, SecureKey.JOB))
    if got != expected:
        return f"reply is for client/round/job {got}, not {expected}"
    if metrics.get(SecureKey.LAYOUT) != layout_digest(layout):
        return "its tensors are not the round's upload spec (layout digest)"
    return None


def _masked_problem(reply: Message, layout: Layout) -> str | None:
    """Why the masked arrays are not what Flower can sum: an array in clear,
    a wrong count, one that does not parse (never unpickled) or one that is
    not integers of the layout's flat shape."""
    if any(len(r) for r in reply.content.array_records.values()):
        return "the reply carries arrays in clear"
    masked = reply.content.config_records[RECORD_KEY_CONFIGS].get(Key.MASKED_PARAMETERS)
    shapes = [(1,), *((math.prod(shape),) for shape, _ in layout.values())]  # flat
    if not _list_of(masked, bytes) or len(masked) != len(shapes):
        return f"expected {len(shapes)} masked arrays"
    for raw, shape in zip(masked, shapes, strict=True):
        try:
            a = bytes_to_ndarray(raw)  # np.load(allow_pickle=False)
        except ValueError as e:
            return f"a masked array does not parse: {e}"
        if tuple(a.shape) != shape or a.dtype.kind not in "iu":
            return f"a masked array is {a.dtype}{a.shape}, expected integers of {shape}"
    return None


def _notes(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The client's notes, bounded (depth, characters, count, length) since
    they are written into the record; unreadable notes are dropped."""
    try:
        raw = jsonio.loads(str(metrics.get(SecureKey.NOTES, "[]")), max_depth=2, max_chars=12_000)
        return tuple(str(x)[:500] for x in raw)[:20]
    except (ValueError, TypeError):
        return ()
