"""A Flower ``Grid`` whose nodes are ClientApps in this process.

Flower 1.41 ships two Grids: the SuperLink's (HTTP, for deployments) and the
simulation engine's in-memory one, whose only backend is Ray. This loopback
Grid runs the osfl ServerApp logic against the osfl ClientApp with neither:
every message is addressed to a virtual node (node config ``partition-id`` =
its index, like Flower's simulation engine), *deflated to Flower's wire
objects and inflated back* (``flwr.supercore.inflatable``: the ArrayRecord
chunking and protobuf encoding a SuperLink applies), handed to the ClientApp
and its reply travels back the same way. It is the ``runtime=flower``
transport of ``osfl run`` when no Flower deployment is around, and what the
fast tests use; real processes are covered by ``docs/flower.md``.

Replies can be computed in a thread pool (``parallel``); the server
aggregates in client order regardless, so results do not depend on it.
:class:`FlowerLoopbackRuntime` (``runtime=flower`` in a config) runs a job
this way: the ServerApp's runtime over a loopback Grid of ClientApps that
share the job object, so the numbers equal the simulation's for the seed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from osfl.errors import ConfigError
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.flower.client import make_client_app
from osfl.flower.secagg_client import add_secure_train
from osfl.flower.secagg_server import grid_runtime
from osfl.flower.spec import JobSpec

#: Loopback node ids start here (any non-zero ints would do; 0 is the server).
FIRST_NODE_ID = 1001


@contextmanager
def loopback_identity(run_id: int = 1) -> Iterator[None]:
    """Give this process a Flower task identity while a loopback run lasts.

    ``flwr.app.Message`` stamps every new message with the process's
    ``TaskIdentity`` (set by Flower when it starts a ServerApp). Outside Flower
    none is set; this sets one (server node 0) and clears it again after.
    An identity Flower already set is left alone.
    """
    try:
        _ = TaskIdentity.run_id
        yield
        return
    except RuntimeError:
        pass
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, 0
    try:
        yield
    finally:
        TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = None  # type: ignore[assignment]


def wire_roundtrip(message: Message) -> tuple[Message, int]:
    """``message`` after Flower's wire encoding — deflated into its object tree
    (metadata + records + 5 MiB array chunks) and inflated back — and the
    number of bytes that tree holds."""
    objects = get_all_nested_objects(message)
    contents = {oid: obj.deflate() for oid, obj in objects.items()}
    nbytes = sum(len(c) for c in contents.values())
    out = inflate_object_from_contents(message.object_id, contents)
    if not isinstance(out, Message):  # pragma: no cover - Flower invariant
        raise TypeError("inflated object is not a Message")
    return out, nbytes


class LoopbackGrid(Grid):
    """``num_nodes`` virtual SuperNodes running ``client_app`` in this process.

    ``run_config`` is what each node's Context carries (the ClientApp reads
    its job spec there unless it was built with a fixed one); ``node_configs``
    adds entries to each node's node config (a real site's ``data``);
    ``wire=False`` skips the wire round trip (only to measure its cost).
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        *,
        run_config: dict[str, str | int | float | bool] | None = None,
        node_configs: Sequence[Mapping[str, str | int | float | bool]] | None = None,
        parallel: int = 1,
        wire: bool = True,
    ):
        if num_nodes < 1:
            raise ConfigError(f"a loopback federation needs at least one node, got {num_nodes}")
        if parallel < 1:
            raise ConfigError(f"parallel must be >= 1, got {parallel}")
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ConfigError(f"node_configs needs one entry per node ({num_nodes})")
        self.client_app = client_app
        self.wire = wire
        self.parallel = parallel
        self._run = Run.create_empty(run_id=1)
        self._contexts = {
            FIRST_NODE_ID + i: Context(
                run_id=1,
                node_id=FIRST_NODE_ID + i,
                node_config={
                    "partition-id": i,
                    "num-partitions": num_nodes,
                    **(dict(node_configs[i]) if node_configs else {}),
                },
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        self._ids = itertools.count(1)
        self._replies: dict[str, Message] = {}
        self.bytes_sent = 0  # deflated bytes of every message, both directions
        self._lock = threading.Lock()

    # --- Grid API -------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        batch = list(messages)
        for msg in batch:
            if msg.metadata.dst_node_id not in self._contexts:
                raise ConfigError(f"no loopback node {msg.metadata.dst_node_id}")
            msg.metadata.__dict__["_message_id"] = f"loopback-{next(self._ids)}"
        if self.parallel > 1 and len(batch) > 1:
            with ThreadPoolExecutor(min(self.parallel, len(batch))) as pool:
                replies = list(pool.map(self._deliver, batch))
        else:
            replies = [self._deliver(m) for m in batch]
        ids = []
        for msg, reply in zip(batch, replies, strict=True):
            self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        return self.pull_messages(ids)

    # --- delivery ---------------------------------------------------------
    def _carry(self, message: Message) -> Message:
        if not self.wire:
            return message
        out, nbytes = wire_roundtrip(message)
        with self._lock:
            self.bytes_sent += nbytes
        return out

    def _deliver(self, message: Message) -> Message:
        inbound = self._carry(message)
        inbound.metadata.__dict__["_message_id"] = message.metadata.message_id
        inbound.metadata.delivered_at = str(time.time())
        context = self._contexts[message.metadata.dst_node_id]
        reply = self.client_app(inbound, context)
        return self._carry(reply)


class FlowerLoopbackRuntime(SimulationRuntime):
    """Flower's message flow in this process: :class:`FlowerGridRuntime` over a
    :class:`LoopbackGrid` whose ClientApps share ``job``. ``parallel_clients``
    and ``threads_per_client`` mean what they mean for the simulation (the
    thread count changes CPU results in the last bits); ``wire=False`` skips
    Flower's wire encoding (only to measure its cost)."""

    name = "flower"

    def __init__(
        self,
        parallel_clients: int = 1,
        threads_per_client: int | None = None,
        *,
        wire: bool = True,
    ):
        super().__init__(parallel_clients, threads_per_client)
        self.wire = wire

    def execute(self, job: Job, *, observers: Sequence[Observer] = ()) -> RunResult:
        def same_job(_: JobSpec) -> Job:
            return job

        app = make_client_app(same_job, JobSpec())
        if job.run.secagg.enabled:
            app = add_secure_train(app, same_job, JobSpec())
        grid = LoopbackGrid(app, job.num_clients, parallel=self.parallel, wire=self.wire)
        runtime = grid_runtime(grid, job.run.secagg, threads=self.pinned_threads())
        with loopback_identity():
            return runtime.execute(job, observers=observers)
