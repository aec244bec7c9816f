"""The server side of secure aggregation: Flower's SecAgg+ workflow over the
ServerApp's ``Grid`` (Message API) as the round loop's transport, for methods
whose server needs only the weighted mean of the clients' tensors (FedAvg and
its kin; :func:`~osfl.fl.secagg_config.secure_refusal`).

SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead", ACM CCS 2020, Algorithm 2, on
Bonawitz et al., ACM CCS 2017, Fig. 4): the masks cancel in the sum, and
Shamir shares of the mask seeds let the server remove the masks of the
clients that sent a vector (and the pairwise masks of those that dropped out)
while at least ``threshold`` neighbours of each client answer. The server
learns the sum, never a vector.

How osfl drives Flower 1.41's workflow
(``flwr/server/workflow/secure_aggregation/secaggplus_workflow.py``):
``SecAggPlusWorkflow`` runs its four stages over any ``flwr.serverapp.Grid``
(osfl's loopback Grid included) but wants a ``LegacyContext`` whose
``Strategy`` hands out each node's ``FitIns`` (workflow line 286) and
receives the unmasked result (line 665), the only two strategy calls it makes.
:class:`SecAggPlusTransport` gives it a one-round stand-in with just those two
(no legacy Strategy with callbacks never called), whose FitIns carry osfl's broadcast and envelope
(:class:`~osfl.fl.secagg_config.SecureKey`), and keeps the result: the
weighted *mean* ``sum_i n_i w_i / sum_i n_i`` (lines 640-650), ``n_i`` the
clients' weights. It is the shared round loop's transport
(:class:`~osfl.fl.runtime.rounds.RoundLoop`): its ``collect`` returns that
mean as the round's :class:`~osfl.fl.runtime.rounds.RoundUploads`, which the
loop hands to the method's ``aggregate_mean``
(:class:`~osfl.fl.method.SecureAggregation`).

The server can still check each reply's *form* (every stage's keys and types,
the masked arrays' shapes, a digest of the summed layout) and the clear-text
weight (Flower sends ``num_examples`` unmasked) against the bound it knows
(:mod:`osfl.flower.secagg_replies`); it cannot validate or screen values
(``docs/secure-aggregation.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, FitRes, Parameters, Scalar
from flwr.compat.common.parameter import bytes_to_ndarray
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from osfl.errors import ConfigError, UploadError
from osfl.fl.method import secure_weighting_of
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.runtime.identity import job_digest
from osfl.fl.runtime.rounds import Inbox, RoundLoop, RoundUploads
from osfl.fl.runtime.sites import SiteScore
from osfl.fl.secagg_config import (
    BROADCAST_TENSOR_TYPE,
    MODULUS_BITS,
    SECURE_WEIGHTINGS,
    Layout,
    QuantizationPlan,
    SecAggPlusConfig,
    SecureKey,
    layout_of,
    plan_round,
    secure_refusal,
)
from osfl.fl.upload import Upload
from osfl.flower.discovery import Bindings, discover
from osfl.flower.grid import FlowerGridRuntime, GridTransport, RemoteNodes, with_discovery_notes
from osfl.flower.secagg_replies import ProtocolGrid, vector_problem

__all__ = [
    "SecAggPlusTransport",
    "SecureGridRuntime",
    "SecureRound",
    "execute_secure",
    "grid_runtime",
    "secure_checkpoint_digest",
]

log = logging.getLogger(__name__)


@dataclass
class SecureRound:
    """What the server learnt in one SecAgg+ round: the weighted ``mean`` of
    the contributors' tensors (float64), their clear-text ``weights`` (Flower
    sends ``num_examples`` unmasked: ``num_samples`` under ``data_size``), why
    the others are not in it, and every protocol message's bytes per client
    (four stages; the broadcast rides in the third)."""

    plan: QuantizationPlan
    mean: dict[str, torch.Tensor]
    weights: dict[int, int]
    dropped: dict[int, str]
    bytes_up: dict[int, int] = field(default_factory=dict)
    bytes_down: dict[int, int] = field(default_factory=dict)
    notes: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def upload(self, layout: Layout) -> Upload:
        """The mean as one Upload in the layout's dtypes (integers: the rounded
        mean, as ``weighted_mean`` does) whose ``num_samples`` is the total weight."""
        tensors = {
            n: (m if layout[n][1].is_floating_point else m.round()).to(layout[n][1])
            for n, m in self.mean.items()
        }
        return Upload(tensors=tensors, meta={"num_samples": sum(self.weights.values())})


# --------------------------------------------------------------------------- Flower's side
class _OneRound:
    """What the workflow reads of its ``LegacyContext.strategy``: exactly two
    calls, ``configure_fit`` (workflow line 286), which hands out osfl's
    FitIns, and ``aggregate_fit`` (line 665), which keeps the contributors'
    FitRes, whose parameters Flower replaced with the unmasked mean (lines
    653-656). Not a Flower ``Strategy``: its other callbacks (evaluation,
    initial parameters) are never called by the workflow, so none is kept."""

    def __init__(self, instructions: list[tuple[ClientProxy, FitIns]]):
        self.instructions = instructions
        self.results: list[tuple[ClientProxy, FitRes]] = []

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.results = list(results)
        return None, {}  # osfl's method aggregates, not a Flower strategy


# --------------------------------------------------------------------------- the transport
class SecAggPlusTransport(RemoteNodes):
    """One SecAgg+ round over the ServerApp's ``grid`` per round of the loop:
    the broadcast goes to the round's clients inside their FitIns; back comes
    the mean of their uploads weighted by ``weighting`` (a
    :data:`~osfl.fl.secagg_config.SECURE_WEIGHTINGS` name), never an upload.
    ``nodes``: client id -> node id (a client without one is out of every
    round, as under the plain transport).

    As the round loop's :class:`~osfl.fl.runtime.rounds.Transport`: no upload
    is parsed, validated, screened or observed (observers see the broadcasts
    only), and nothing goes through the pending uploads of the round
    checkpoints: a SecAgg+ round is all or nothing, and a run stopped inside
    one runs it again on restart (its checkpoints are tagged ``secagg``, so a
    plain run's are never continued under SecAgg+, nor the reverse).
    :meth:`restore` has nothing to give back (each SuperNode keeps its state),
    and :meth:`evaluate` is the plain :class:`GridTransport`'s (the released
    final model goes to the sites in clear anyway; they answer with counts).
    ``history`` keeps what the server learnt in each round this process ran."""

    checkpoint_tag = "secagg"

    def __init__(
        self,
        grid: Grid,
        nodes: Mapping[int, int],
        digest: str,
        config: SecAggPlusConfig,
        timeout: float,
        weighting: str = "data_size",
        *,
        num_classes: int,
        absent: Mapping[int, str] | None = None,
    ):
        self.grid, self.nodes, self.digest = grid, dict(nodes), digest
        self.config, self.timeout = config, timeout
        self.weighting = SECURE_WEIGHTINGS.get(weighting)
        self.weighting_name = weighting
        self.plain = GridTransport(grid, self.nodes, digest, timeout, num_classes, absent)
        self.history: list[SecureRound] = []

    # --- the Transport protocol ----------------------------------------------------
    def collect(
        self, inbox: Inbox, state: Any, round: int, clients: list[int], payload: bytes
    ) -> RoundUploads:
        """The round's weighted mean (the specs bound each client's weight)."""
        specs = {c: inbox.spec_for(state, round, c) for c in clients}
        layout = layout_of(specs)
        fallback = inbox.job.run.server.max_num_samples
        bounds = {c: int(specs[c].meta["num_samples"].high or fallback) for c in clients}
        with inbox.task(round, "SecAgg+", 1) as task:
            secure = self.secure_mean(round, clients, payload, layout, bounds)
            task.advance()
        self.history.append(secure)
        accepted = sorted(secure.weights)
        log.info(
            "round %d: SecAgg+ mean of clients %s; dropped %s", round, accepted, secure.dropped
        )
        return RoundUploads(
            accepted=accepted,
            refused=dict(secure.dropped),
            mean=secure.upload(layout),
            bytes_up={c: secure.bytes_up.get(c, 0) for c in accepted},
            bytes_down={c: secure.bytes_down.get(c, 0) for c in clients},
            bytes_refused=sum(secure.bytes_up.get(c, 0) for c in secure.dropped),
            warnings={c: list(n) for c, n in secure.notes.items()},
        )

    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]:
        """The sites score the released final state on their own test sets
        (plain messages: nothing in them is a client's upload)."""
        return self.plain.evaluate(payload, clients)

    def score_client_models(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        """Each node scores its client's own model (plain messages, as
        :meth:`evaluate`'s)."""
        return self.plain.score_client_models(payload, clients)

    # --- one secure round ------------------------------------------------------------
    def secure_mean(
        self,
        round: int,
        clients: Sequence[int],
        payload: bytes,
        layout: Layout,
        bounds: Mapping[int, int],
    ) -> SecureRound:
        """The weighted mean of the uploads of ``clients`` for the broadcast
        ``payload``; ``layout``: what they upload; ``bounds``: the largest
        ``num_samples`` the server accepts from each. An UploadError when
        SecAgg+ cannot run or stops (fewer than 2 reachable clients, fewer
        answers than its threshold)."""
        reachable, unreachable = self.reachable(round, clients)
        plan = plan_round(
            self.config, layout, {c: bounds[c] for c in reachable}, self.weighting_name
        )
        node_to_client = {self.nodes[c]: c for c in reachable}
        seen: dict[int, tuple[int, tuple[str, ...]]] = {}

        def check_vector(reply: Message, client: int) -> str | None:
            limit = min(self.weighting.bound(bounds[client]), plan.max_weight)
            why, n, notes = vector_problem(reply, client, round, self.digest, layout, limit)
            if why is None:
                seen[client] = (n, notes)
            return why

        grid = ProtocolGrid(self.grid, node_to_client, check_vector, self.timeout)
        strategy = self.run_workflow(grid, round, reachable, payload, plan)
        if not strategy.results:
            _stopped(round, {**unreachable, **grid.dropped})
        mean = _unscaled_mean(strategy, layout, plan)
        contributors = sorted(node_to_client[p.node_id] for p, _ in strategy.results)
        return SecureRound(
            plan=plan,
            mean=mean,
            weights={c: seen[c][0] for c in contributors},
            dropped={
                c: unreachable.get(c) or grid.dropped.get(c, "dropped by SecAgg+")
                for c in clients
                if c not in contributors
            },
            bytes_up=grid.bytes_up,
            bytes_down=grid.bytes_down,
            notes={c: seen[c][1] for c in contributors if seen[c][1]},
        )

    def reachable(self, round: int, clients: Sequence[int]) -> tuple[list[int], dict[int, str]]:
        """The clients with a SuperNode, and why each other one is not
        reached; refused when fewer than 2 remain, since the masked sum of
        one client is its upload."""
        if len(clients) < 2:
            raise ConfigError(
                f"round {round}: SecAgg+ needs at least 2 clients in a round, got "
                f"{len(clients)} (the 'sum' of one client is its upload)"
            )
        unreachable = {c: self.plain.no_node(c) for c in clients if c not in self.nodes}
        reachable = [c for c in clients if c in self.nodes]
        if len(reachable) < 2:
            raise UploadError(
                f"round {round}: SecAgg+ needs at least 2 clients with a SuperNode, got "
                f"{reachable} (no SuperNode for {sorted(unreachable)})"
            )
        return reachable, unreachable

    def run_workflow(
        self,
        grid: ProtocolGrid,
        round: int,
        clients: Sequence[int],
        payload: bytes,
        plan: QuantizationPlan,
    ) -> _OneRound:
        """Flower's four SecAgg+ stages over ``grid`` for ``clients``; the
        returned strategy holds the unmasked mean (or nothing, when it stopped)."""
        run_id = self.grid.run.run_id
        proxies = {c: GridClientProxy(self.nodes[c], grid, run_id) for c in clients}
        known = SimpleClientManager()  # only for the workflow's log line
        for proxy in proxies.values():
            known.register(proxy)
        strategy = _OneRound([(proxies[c], self.fitins(round, c, payload, plan)) for c in clients])
        state = RecordDict(
            {
                MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: int(round)}),
                MAIN_PARAMS_RECORD: ArrayRecord(),
            }
        )
        context = Context(run_id=run_id, node_id=0, node_config={}, state=state, run_config={})
        workflow = SecAggPlusWorkflow(
            num_shares=float(self.config.share_fraction),
            reconstruction_threshold=float(self.config.threshold_fraction),
            max_weight=float(plan.max_weight),
            clipping_range=float(plan.clipping_range),
            quantization_range=2**plan.quantization_bits,
            modulus_range=2**MODULUS_BITS,
            timeout=self.timeout,
        )
        # the workflow calls only the two methods _OneRound has (see its docstring)
        legacy = LegacyContext(context, strategy=cast(Strategy, strategy), client_manager=known)
        workflow(grid, legacy)
        return strategy

    def fitins(self, round: int, client: int, payload: bytes, plan: QuantizationPlan) -> FitIns:
        """Client ``client``'s instructions: the broadcast, osfl's envelope and
        the round's quantisation plan."""
        return FitIns(
            parameters=Parameters([payload], BROADCAST_TENSOR_TYPE),
            config={
                SecureKey.ROUND: round,
                SecureKey.CLIENT: client,
                SecureKey.JOB: self.digest,
                SecureKey.PLAN: plan.to_json(),
            },
        )


# --------------------------------------------------------------------------- the runtime
def secure_checkpoint_digest(digest: str) -> str:
    """The job digest a secure run's checkpoints carry (the round loop adds
    the transport's ``checkpoint_tag``)."""
    return f"{digest}+{SecAggPlusTransport.checkpoint_tag}"


def execute_secure(
    grid: Grid,
    job: Job,
    config: SecAggPlusConfig,
    *,
    weighting: str | None,
    observers: Sequence[Observer] = (),
    digest: str | None = None,
    round_timeout: float = 600.0,
    node_timeout: float = 120.0,
    threads: int | None = None,
    bindings: Bindings = (),
) -> RunResult:
    """``FlowerGridRuntime.execute`` under SecAgg+: refuse what cannot run
    (:func:`~osfl.fl.secagg_config.secure_refusal`; ``weighting``: the
    method's ``secure_weighting``), discover the nodes, run the round loop
    over :class:`SecAggPlusTransport`. ``digest`` is the one the nodes must
    have built (default: this job's); ``bindings``: which node plays which
    site besides the job's registry (:func:`osfl.flower.discovery.discover`)."""
    job.method.check()
    why = secure_refusal(job.method.name, weighting, job.run.server)
    if why is not None:
        raise ConfigError(f"secure aggregation: {why}")
    assert weighting is not None  # secure_refusal refuses None
    digest = digest or job_digest(job)
    log.info(
        "osfl ServerApp under SecAgg+: method %s (%s weighting), seed %d, %d clients, job %s",
        job.method.name,
        weighting,
        job.seed,
        job.num_clients,
        digest,
    )
    found = discover(grid, job, digest, node_timeout, bindings)
    transport = SecAggPlusTransport(
        grid,
        found.nodes,
        digest,
        config,
        round_timeout,
        weighting,
        num_classes=job.run.num_classes,
        absent=found.absent,
    )
    result = RoundLoop(job, transport, observers, threads=threads).execute()
    return with_discovery_notes(result, found)


class SecureGridRuntime(FlowerGridRuntime):
    """:class:`FlowerGridRuntime` whose rounds run under SecAgg+ with
    ``config`` (:func:`execute_secure`)."""

    def __init__(self, grid: Grid, config: SecAggPlusConfig, **kwargs: Any):
        super().__init__(grid, **kwargs)
        self.config = config

    def execute(
        self, job: Job, *, observers: Sequence[Observer] = (), digest: str | None = None
    ) -> RunResult:
        return execute_secure(
            self.grid,
            job,
            self.config,
            weighting=secure_weighting_of(job.method),
            observers=observers,
            digest=digest,
            round_timeout=self.round_timeout,
            node_timeout=self.node_timeout,
            threads=self.threads,
            bindings=self.bindings,
        )


def grid_runtime(grid: Grid, secagg: SecAggPlusConfig, **kwargs: Any) -> FlowerGridRuntime:
    """The Grid runtime a config asks for: under SecAgg+ when ``secagg.enabled``
    (``kwargs``: :class:`FlowerGridRuntime`'s timeouts and threads)."""
    if secagg.enabled:
        return SecureGridRuntime(grid, secagg, **kwargs)
    return FlowerGridRuntime(grid, **kwargs)


def _stopped(round: int, why: Mapping[int, str]) -> NoReturn:
    """Raise the one line that says SecAgg+ stopped, naming why each client
    is missing (unreachable or dropped)."""
    detail = "; ".join(f"client {c}: {w}" for c, w in sorted(why.items()))
    raise UploadError(
        f"round {round}: secure aggregation stopped, too few clients answered for "
        f"SecAgg+'s reconstruction threshold ({detail or 'no reason given'})"
    )


def _unscaled_mean(
    strategy: _OneRound, layout: Layout, plan: QuantizationPlan
) -> dict[str, torch.Tensor]:
    """The workflow's unmasked mean back in the layout's shapes and units:
    each tensor was uploaded divided by its plan scale (float64, as summed)."""
    arrays = [bytes_to_ndarray(t) for t in strategy.results[0][1].parameters.tensors]
    return {
        name: torch.from_numpy(np.asarray(a, dtype=np.float64).reshape(shape)) * plan.scales[name]
        for (name, (shape, _)), a in zip(layout.items(), arrays, strict=True)
    }
