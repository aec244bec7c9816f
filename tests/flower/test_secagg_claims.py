"""SecAgg+ (Bell et al., ACM CCS 2020, Algorithm 2, over Flower's
``SecAggPlusWorkflow``) by value: what each client claims about itself is
held to the server's own bound, and after a client drops out every number
the server keeps stays with its own client.

The server of a SecAgg+ round sees, per client, a masked vector and the
clear-text weight Flower sends next to it (``num_examples``); it checks
that weight against the bound *it* knows for that client (the client's
partition size in a rehearsal, capped by the round's ``max_weight``) and
the reply's envelope (client, round, job) against who sent it. Each test
gives every client a different, recognisable role: different partition
sizes, one liar or one dropout at the first, a middle or the last position.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.assembly import build_job, load_splits, seed_context
from osfl.config import load_config
from osfl.errors import UploadError
from osfl.fl.method import MethodWrapper, SecureAggregation, secure_weighting_of
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.rounds import RoundLoop
from osfl.fl.secagg_config import SecAggPlusConfig, layout_of, plan_round
from osfl.fl.upload import Upload
from osfl.flower.client import make_client_app
from osfl.flower.grid import discover_clients
from osfl.flower.loopback import FIRST_NODE_ID, LoopbackGrid, loopback_identity
from osfl.flower.secagg_client import add_secure_train, secure_vector
from osfl.flower.secagg_server import SecAggPlusTransport
from osfl.flower.spec import JobSpec, job_digest
from support.smoke import one_torch_thread  # noqa: F401  (an autouse fixture)
from support.tiny import TINY_FLOWER


class Claims(MethodWrapper, SecureAggregation):
    """FedAvg whose client ``liar`` claims one sample more than it holds and
    whose clients in ``fail`` drop out (their client step refuses)."""

    def __init__(self, inner: Any, liar: int | None = None, fail: Iterable[int] = ()):
        super().__init__(inner)
        self.liar, self.fail = liar, set(fail)

    @property
    def secure_weighting(self) -> str | None:
        return secure_weighting_of(self.inner)

    def aggregate_mean(self, state: Any, mean: Upload, round: int) -> Any:
        inner = self.inner
        assert isinstance(inner, SecureAggregation)
        return inner.aggregate_mean(state, mean, round)

    def client_update(self, ctx: Any, broadcast: Any, data: Any) -> Upload:
        if ctx.client_id in self.fail:
            raise UploadError("the site went offline", client=ctx.client_id)
        up = self.inner.client_update(ctx, broadcast, data)
        if ctx.client_id == self.liar:
            up = Upload(up.tensors, {**up.meta, "num_samples": up.meta["num_samples"] + 1})
        return up


def _job(cache: Path, **claims: Any) -> Job:
    """One-shot FedAvg, digits 8 px, 3 clients of different sizes (training cached)."""
    cfg = load_config(
        None,
        [*TINY_FLOWER, "train.epochs=1", "methods=[fedavg]", f"cache_dir={cache}"],
    )
    job = build_job(cfg, "fedavg", seed_context(cfg, load_splits(cfg), 0))
    job.method = Claims(job.method, **claims)
    return job


class TamperGrid(LoopbackGrid):
    """The loopback Grid; ``tamper(reply)`` may rewrite a reply on its way."""

    def __init__(self, *args: Any, tamper: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tamper = tamper

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = list(super().pull_messages(message_ids))
        if self.tamper is not None:
            for reply in out:
                self.tamper(reply)
        return out


def _run(job: Job, nodes: Iterable[int] | None = None, tamper: Any = None) -> tuple[Any, Any]:
    app = add_secure_train(make_client_app(lambda s: job, JobSpec()), lambda s: job, JobSpec())
    grid = TamperGrid(app, job.num_clients, tamper=tamper)
    with loopback_identity():
        digest = job_digest(job)
        found = discover_clients(grid, job, digest, timeout=10)
        if nodes is not None:
            found = {c: n for c, n in found.items() if c in set(nodes)}
        transport = SecAggPlusTransport(
            grid, found, digest, SecAggPlusConfig(), 60, "data_size", num_classes=10
        )
        result = RoundLoop(job, transport).execute()
    return transport, result


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secagg-claims-cache")


@pytest.fixture(scope="module")
def sizes(cache: Path) -> dict[int, int]:
    job = _job(cache)
    out = {c: job.clients.size(c) for c in range(3)}
    assert len(set(out.values())) == 3  # each client's bound is its own
    return out


@pytest.mark.parametrize("liar", [0, 2])
def test_a_weight_beyond_the_client_s_own_partition_is_a_dropout(
    cache: Path, sizes: dict[int, int], liar: int
) -> None:
    """The liar's claim (its size + 1) fits the round's ``max_weight`` (the
    largest client's bound, rounded up to a power of two) but not its own
    partition: the server drops it and sums the two honest clients, with
    their own weights."""
    transport, result = _run(_job(cache, liar=liar))
    (secure,) = transport.history
    n = sizes[liar]
    assert n + 1 <= secure.plan.max_weight  # only the client's own bound can refuse it
    assert f"weight (num_examples) {n + 1} lies outside [1, {n}]" in secure.dropped[liar]
    honest = {c: sizes[c] for c in range(3) if c != liar}
    assert secure.weights == honest
    assert result.rounds[0].accepted == sorted(honest)


@pytest.mark.parametrize("dropout", [0, 1, 2])
def test_after_a_dropout_each_number_stays_with_its_own_client(
    cache: Path, sizes: dict[int, int], dropout: int
) -> None:
    """One client drops out mid-protocol at each position in turn: the
    weights the server keeps are the other two clients' own sizes, the mean's
    ``num_samples`` is their sum, and the round's upload bytes are theirs
    (the dropout's messages count as refused)."""
    transport, result = _run(_job(cache, fail=[dropout]))
    (secure,) = transport.history
    kept = [c for c in range(3) if c != dropout]
    assert secure.weights == {c: sizes[c] for c in kept}
    record = result.rounds[0]
    assert record.accepted == kept and set(record.refused) == {dropout}
    assert record.bytes_up == sum(secure.bytes_up[c] for c in kept)
    assert record.bytes_refused == secure.bytes_up[dropout]
    assert secure.bytes_up[dropout] != secure.bytes_up[kept[0]]  # a shift would show


def test_a_reply_that_names_another_client_is_a_dropout(cache: Path, sizes: dict[int, int]) -> None:
    """Client 1's masked vector arrives with an envelope naming client 0 (a
    node answering for another site, or a replay): the server drops it."""

    def rename(reply: Message) -> None:
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if reply.metadata.src_node_id == FIRST_NODE_ID + 1 and Key.MASKED_PARAMETERS in configs:
            reply.content.config_records["fitres.metrics"]["client"] = 0

    transport, _ = _run(_job(cache), tamper=rename)
    (secure,) = transport.history
    assert "reply is for client/round/job (0, 0," in secure.dropped[1]
    assert secure.weights == {0: sizes[0], 2: sizes[2]}


@pytest.mark.parametrize("absent", [0, 2])
def test_the_round_is_planned_over_the_clients_that_can_take_part(
    cache: Path, sizes: dict[int, int], absent: int
) -> None:
    """A client without a SuperNode is out of the round before it starts:
    the quantisation plan counts the two others (its grid and its counters'
    scale are made for their number and their weights)."""
    job = _job(cache)
    transport, _ = _run(job, nodes=[c for c in range(3) if c != absent])
    (secure,) = transport.history
    kept = {c: sizes[c] for c in range(3) if c != absent}
    layout = layout_of({0: job.method.upload_spec(job.method.init_state(), 0, 0)})
    assert secure.plan.clients == 2
    assert secure.plan == plan_round(SecAggPlusConfig(), layout, kept, "data_size")


def test_the_clip_check_is_on_the_weighted_value_the_mod_quantises() -> None:
    """Flower's mod multiplies each value by ``n / max_weight`` before it
    clips to ``[-c, c]``: a value of 1.2 at weight 100/128 (0.94) fits
    ``c = 1``, one of 1.3 (1.02) does not."""
    layout = {"w": ((2,), torch.float32)}
    plan = plan_round(SecAggPlusConfig(clipping_range=1.0), layout, {0: 100, 1: 100}, "data_size")
    assert plan.max_weight == 128
    fits = Upload({"w": torch.tensor([1.2, -1.2])}, {"num_samples": 100})
    (a,), n = secure_vector(fits, plan, client=0)
    assert n == 100 and a.tolist() == pytest.approx([1.2, -1.2])
    over = Upload({"w": torch.tensor([0.0, -1.3])}, {"num_samples": 100})
    with pytest.raises(UploadError, match=r"reaches 1\.016, beyond SecAgg\+'s clipping_range 1"):
        secure_vector(over, plan, client=0)
