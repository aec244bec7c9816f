"""FedAvg under Flower's SecAgg+ (``osfl.flower.secagg_server`` and
``osfl.flower.secagg_client``, planned by ``osfl.fl.secagg_config``) on the
in-process loopback Grid: Flower's own ``secaggplus_mod`` and
``SecAggPlusWorkflow``, every message through Flower's wire encoding.

The global model must equal plain FedAvg's aggregate within the quantisation
bound ``s * 2 k c m / (Q N)`` derived in ``osfl.fl.secagg_config`` (integer
buffers: the rounded mean), the server must never hold an individual upload
(a spy on ``aggregate``, on the observers and on every reply that reaches the
server), a client that drops out mid-protocol (or has no SuperNode) must be
left out of the mean, a malformed reply must be a dropout, not a crash, a
stopped run must resume after its last finished round, and real sites must
train under SecAgg+ and score the final model themselves."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common.parameter import bytes_to_ndarray

from osfl.errors import ConfigError, DataError, UploadError
from osfl.fl.method import MethodWrapper, SecureAggregation, secure_weighting_of
from osfl.fl.observers import Observer
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.checkpoint import Resume, RoundCheckpoints
from osfl.fl.runtime.rounds import RoundLoop
from osfl.fl.runtime.simulation import InProcessClients, SimulationRuntime
from osfl.fl.secagg_config import (
    QuantizationPlan,
    SecAggPlusConfig,
    layout_of,
    plan_round,
    secure_refusal,
)
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import NUM_SAMPLES, TensorSpec, Upload, UploadSpec
from osfl.flower.client import make_client_app
from osfl.flower.grid import discover_clients
from osfl.flower.loopback import FIRST_NODE_ID, LoopbackGrid, loopback_identity
from osfl.flower.secagg_client import add_secure_train, secure_vector
from osfl.flower.secagg_server import (
    SecAggPlusTransport,
    execute_secure,
    secure_checkpoint_digest,
)
from osfl.flower.spec import JobSpec, job_digest
from support.smoke import one_torch_thread  # noqa: F401  (an autouse fixture)
from support.tiny import TINY_FLOWER, TINY_GREY

EPS32 = float(torch.finfo(torch.float32).eps)


# --------------------------------------------------------------------------- spies
class UploadSpy(Observer):
    """What a runtime shows its observers: broadcasts and individual uploads."""

    def __init__(self) -> None:
        self.uploads: dict[int, Upload] = {}
        self.broadcasts = 0

    def on_broadcast(self, round: int, client: int, broadcast: Any, nbytes: int) -> None:
        self.broadcasts += 1

    def on_upload(self, round: int, client: int, upload: Upload, nbytes: int, truth=None) -> None:
        self.uploads[client] = upload


class AggregateSpy(MethodWrapper, SecureAggregation):
    """The method with a record of everything its ``aggregate`` (individual
    uploads, in ``received``) and ``aggregate_mean`` (SecAgg+'s weighted mean,
    in ``means``) received and returned; ``fail`` clients send nothing (their
    client step refuses); ``crash_at``: the server stops in that round's
    aggregation, once."""

    def __init__(self, inner: Any, fail: Iterable[int] = (), crash_at: int | None = None):
        super().__init__(inner)
        self.fail = set(fail)
        self.crash_at = crash_at
        self.received: list[dict[int, Upload]] = []
        self.means: list[Upload] = []
        self.before: list[Any] = []  # the state each aggregate started from
        self.after: list[Any] = []  # and the state it returned

    def client_update(self, ctx: Any, broadcast: Any, data: Any) -> Upload:
        if ctx.client_id in self.fail:
            raise UploadError("the site went offline", client=ctx.client_id)
        return self.inner.client_update(ctx, broadcast, data)

    @property
    def secure_weighting(self) -> str | None:
        return secure_weighting_of(self.inner)

    def maybe_stop(self, round: int) -> None:
        if round == self.crash_at:
            self.crash_at = None
            raise ServerStopped(f"the server stopped in round {round}")

    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        self.maybe_stop(round)
        self.received.append(dict(uploads))
        self.before.append(state)
        self.after.append(self.inner.aggregate(state, uploads, round))
        return self.after[-1]

    def aggregate_mean(self, state: Any, mean: Upload, round: int) -> Any:
        self.maybe_stop(round)
        self.means.append(mean)
        self.before.append(state)
        inner = self.inner
        assert isinstance(inner, SecureAggregation)
        self.after.append(inner.aggregate_mean(state, mean, round))
        return self.after[-1]


class ServerStopped(RuntimeError):
    """A server killed mid-run (what a restart resumes from)."""


class SpyGrid(LoopbackGrid):
    """The loopback Grid with a record of every reply that reaches the server;
    ``tamper(reply)`` may rewrite a reply on its way (a dishonest client)."""

    def __init__(self, *args: Any, tamper: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.replies: list[Message] = []
        self.tamper = tamper

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = list(super().pull_messages(message_ids))
        if self.tamper is not None:
            for reply in out:
                self.tamper(reply)
        self.replies.extend(out)
        return out


def masked_replies(grid: SpyGrid) -> dict[int, Message]:
    """Client -> its reply of the masked-vector stage."""
    return {
        r.metadata.src_node_id - FIRST_NODE_ID: r
        for r in grid.replies
        if not r.has_error()
        and Key.MASKED_PARAMETERS in r.content.config_records.get(RECORD_KEY_CONFIGS, {})
    }


# --------------------------------------------------------------------------- jobs and runs
def fedavg_job(
    cache: Path,
    fail: Iterable[int] = (),
    weighting: str = "data_size",
    overrides: Iterable[str] = (),
    crash_at: int | None = None,
) -> Job:
    """One-shot FedAvg, digits 8 px, 3 clients, one local epoch; client
    training cached in ``cache`` so that every run here trains each client once."""
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.assembly import build_job, load_splits, seed_context
    from osfl.config import load_config

    cfg = load_config(
        None,
        [
            *TINY_FLOWER,
            "train.epochs=1",
            "methods=[fedavg]",
            f"method.fedavg.weighting={weighting}",
            f"cache_dir={cache}",
            *overrides,
        ],
    )
    job = build_job(cfg, "fedavg", seed_context(cfg, load_splits(cfg), 0))
    job.method = AggregateSpy(job.method, fail, crash_at)
    return job


def run_secure(
    job: Job,
    tamper: Any = None,
    weighting: str = "data_size",
    nodes: Iterable[int] | None = None,
) -> tuple[SecAggPlusTransport, Any, SpyGrid, UploadSpy]:
    """The job under SecAgg+ (default knobs) on a loopback Grid of osfl
    ClientApps; ``nodes``: the clients whose SuperNode connected (default all)."""
    app = add_secure_train(make_client_app(lambda s: job, JobSpec()), lambda s: job, JobSpec())
    grid = SpyGrid(app, job.num_clients, tamper=tamper)
    spy = UploadSpy()
    with loopback_identity():
        digest = job_digest(job)
        found = discover_clients(grid, job, digest, timeout=10)
        if nodes is not None:
            found = {c: n for c, n in found.items() if c in set(nodes)}
        transport = SecAggPlusTransport(
            grid, found, digest, SecAggPlusConfig(), 60, weighting, num_classes=10
        )
        result = RoundLoop(job, transport, [spy]).execute()
    return transport, result, grid, spy


def excess(
    secure: Mapping[str, torch.Tensor],
    uploads: Mapping[int, Upload],
    plan: QuantizationPlan,
    uniform: bool = False,
) -> float:
    """How far the worst coordinate of ``secure`` lies beyond the derived
    bound around the exact sample-weighted (or plain) mean of ``uploads``,
    computed here in float64 (<= 0: within the bound everywhere)."""
    counts = {c: 1 if uniform else int(u.meta["num_samples"]) for c, u in uploads.items()}
    total, k = sum(counts.values()), len(counts)
    step = 2 * plan.clipping_range / 2**plan.quantization_bits
    unit = k * step * plan.max_weight / total  # the bound 2 k c m / (Q N), derived independently
    worst = -math.inf
    for name, got in secure.items():
        exact = sum(counts[c] * uploads[c].tensors[name].double() for c in uploads) / total
        bound = plan.scales[name] * unit
        if got.is_floating_point():  # + one float32 rounding of each mean
            tol = bound + EPS32 * (exact.abs() + bound)
        else:  # the rounded mean
            tol = torch.full_like(exact, 0.5 + bound)
        worst = max(worst, float(((got.double() - exact).abs() - tol).max()))
    return worst


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secagg-cache")


@pytest.fixture(scope="module")
def plain(cache: Path) -> tuple[Any, UploadSpy]:
    """Plain FedAvg in the simulation: its result and its individual uploads."""
    spy = UploadSpy()
    return SimulationRuntime().execute(fedavg_job(cache), observers=[spy]), spy


def test_fedavg_under_secaggplus_equals_plain_fedavg_within_the_bound(
    cache: Path, plain: tuple[Any, UploadSpy]
) -> None:
    plain_result, plain_spy = plain
    uploads = plain_spy.uploads
    assert sorted(uploads) == [0, 1, 2]
    job = fedavg_job(cache)
    transport, result, grid, spy = run_secure(job)

    (secure,) = transport.history
    plan = secure.plan
    sizes = [job.clients.size(c) for c in range(3)]
    assert plan.max_weight == 2 ** math.ceil(math.log2(max(sizes)))  # exact weights
    assert plan.quantization_bits == 30  # the finest grid 3 clients allow under 2**32
    assert secure.weights == {c: sizes[c] for c in range(3)} and not secure.dropped

    # the global model: plain FedAvg's aggregate within the quantisation bound
    assert excess(result.state, uploads, plan) <= 0
    assert excess(secure.mean, uploads, plan) <= 0
    diff = max(
        (result.state[k].double() - plain_result.state[k].double()).abs().max().item()
        for k in result.state
    )
    assert diff < 1e-6  # the bound here is ~7e-8 (+ float32 rounding)
    acc, plain_acc = (
        result.metrics["global_test_accuracy"],
        plain_result.metrics["global_test_accuracy"],
    )
    assert abs(acc - plain_acc) <= 2 / result.metrics["num_samples"]
    assert acc > 0.3  # chance is 0.1
    record = result.rounds[0]
    assert record.accepted == [0, 1, 2] and record.refused == {}
    assert record.bytes_up > 0 and result.bytes_up == record.bytes_up

    # the server never held an individual upload:
    # - the method received the mean, never an individual upload
    (received,) = job.method.means
    assert job.method.received == []
    assert received.meta == {"num_samples": sum(sizes)}
    for c, up in uploads.items():
        gap = max(
            (received.tensors[n].double() - t.double()).abs().max()
            for n, t in up.tensors.items()
            if t.is_floating_point()
        )
        assert gap > 1e-3, f"the aggregate equals client {c}'s upload"
    # - no observer saw an upload; they saw the broadcasts
    assert spy.uploads == {} and spy.broadcasts == 3
    # - no reply that reached the server holds an array in clear, and each
    #   masked vector is unrelated to its client's quantised upload
    assert all(len(rec) == 0 for r in grid.replies for rec in r.content.array_records.values())
    masked = masked_replies(grid)
    assert sorted(masked) == [0, 1, 2]
    q = 2**plan.quantization_bits
    for c, reply in masked.items():
        arrays = [
            bytes_to_ndarray(b)
            for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        ]
        weight = sizes[c] / plan.max_weight
        near = total = 0
        for (name, scale), a in zip(plan.scales.items(), arrays[1:], strict=True):
            x = uploads[c].tensors[name].double().numpy().reshape(-1) / scale * weight
            unmasked = np.floor((x + plan.clipping_range) * q / (2 * plan.clipping_range))
            near += int((np.abs(a.astype(np.float64) - unmasked) <= 1).sum())
            total += a.size
        assert total > 10_000 and near / total < 0.01, f"client {c}'s vector is not masked"


def test_a_client_that_drops_out_mid_protocol_is_left_out_of_the_mean(
    cache: Path, plain: tuple[Any, UploadSpy]
) -> None:
    """Client 2 shares its keys, then fails its local step: SecAgg+ removes
    its pairwise masks from the others' shares (threshold 2 of 3) and the
    mean is FedAvg's over clients 0 and 1."""
    _, plain_spy = plain
    transport, result, grid, _ = run_secure(fedavg_job(cache, fail=[2]))
    (secure,) = transport.history
    assert sorted(secure.weights) == [0, 1]
    assert "the site went offline" in secure.dropped[2]
    assert result.rounds[0].refused == secure.dropped and result.rounds[0].accepted == [0, 1]
    kept = {c: plain_spy.uploads[c] for c in (0, 1)}
    assert excess(secure.mean, kept, secure.plan) <= 0
    assert excess(result.state, kept, secure.plan) <= 0
    assert sorted(masked_replies(grid)) == [0, 1]


def test_uniform_weighting_gives_the_plain_mean(cache: Path, plain: tuple[Any, UploadSpy]) -> None:
    """FedAvg with ``weighting=uniform`` (FedBFPT's and the schemes' default):
    every client weighs 1, so the server learns no sample count either."""
    _, plain_spy = plain
    transport, result, _, _ = run_secure(
        fedavg_job(cache, weighting="uniform"), weighting="uniform"
    )
    (secure,) = transport.history
    assert secure.weights == {0: 1, 1: 1, 2: 1} and secure.plan.max_weight == 1
    assert excess(result.state, plain_spy.uploads, secure.plan, uniform=True) <= 0
    assert excess(result.state, plain_spy.uploads, secure.plan) > 1e-4  # not data-size weighted


def test_a_reply_with_its_upload_in_clear_is_dropped_never_read(
    cache: Path, plain: tuple[Any, UploadSpy]
) -> None:
    """A dishonest client 1 puts arrays in clear next to its masked vector:
    the server refuses that reply (a dropout) and sums the other two."""

    def leak(reply: Message) -> None:
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if reply.metadata.src_node_id == FIRST_NODE_ID + 1 and Key.MASKED_PARAMETERS in configs:
            leaked = Array(np.zeros(3, dtype=np.float32))
            reply.content.array_records["fitres.parameters"] = ArrayRecord({"0": leaked})

    transport, result, _, _ = run_secure(fedavg_job(cache), tamper=leak)
    (secure,) = transport.history
    assert "carries arrays in clear" in secure.dropped[1]
    assert result.rounds[0].accepted == [0, 2]
    kept = {c: plain[1].uploads[c] for c in (0, 2)}
    assert excess(result.state, kept, secure.plan) <= 0


def test_methods_that_need_individual_uploads_are_refused_before_training(cache: Path) -> None:
    job = fedavg_job(cache)
    grid = LoopbackGrid(make_client_app(lambda s: job, JobSpec()), 3)
    with pytest.raises(ConfigError, match=r"'fedavg' needs the clients' individual uploads"):
        execute_secure(grid, job, SecAggPlusConfig(), weighting=None)
    assert grid.bytes_sent == 0  # not one message: no node was asked anything


def test_a_client_without_a_supernode_is_left_out_of_the_mean(
    cache: Path, plain: tuple[Any, UploadSpy]
) -> None:
    """Client 2's SuperNode never connected (``discover_clients`` went on
    without it): it is out of the round, as under the plain transport, and
    the mean is FedAvg's over clients 0 and 1."""
    transport, result, _, _ = run_secure(fedavg_job(cache), nodes=[0, 1])
    (secure,) = transport.history
    assert secure.dropped == {2: "no SuperNode connected"} and sorted(secure.weights) == [0, 1]
    assert result.rounds[0].refused == secure.dropped
    kept = {c: plain[1].uploads[c] for c in (0, 1)}
    assert excess(result.state, kept, secure.plan) <= 0


def test_a_round_with_fewer_than_min_clients_stops_the_run(cache: Path) -> None:
    job = fedavg_job(cache, fail=[2], overrides=["server.min_clients=3"])
    with pytest.raises(
        UploadError, match=r"2 usable upload\(s\) of 3 client\(s\), fewer than server.min_clients=3"
    ):
        run_secure(job)
    assert job.method.means == []  # the mean of too few never reached aggregation


def test_a_stopped_secure_run_resumes_after_its_last_finished_round(
    cache: Path, tmp_path: Path
) -> None:
    """Two rounds; the server stops in round 1. The restarted server (a fresh
    method object, a fresh Grid) runs round 1 only, from round 0's
    checkpointed state exactly, and keeps round 0's record and bytes."""
    job = fedavg_job(cache, overrides=["method.fedavg.rounds=2"], crash_at=1)
    job.state_dir = tmp_path / "state"
    with pytest.raises(ServerStopped):
        run_secure(job)
    (after_round_0,) = job.method.after
    job.method = AggregateSpy(job.method.inner)
    transport, result, _, spy = run_secure(job)

    assert len(transport.history) == 1 and spy.broadcasts == 3  # round 1 only, in this process
    (resumed_from,) = job.method.before
    assert resumed_from.keys() == after_round_0.keys()
    assert all(torch.equal(resumed_from[k], after_round_0[k]) for k in after_round_0)
    assert len(job.method.means) == 1 and job.method.received == []
    assert [r.round for r in result.rounds] == [0, 1]
    assert all(r.accepted == [0, 1, 2] and r.bytes_up > 0 for r in result.rounds)
    assert result.bytes_up == sum(r.bytes_up for r in result.rounds)  # round 0's from the file
    assert result.metrics["global_test_accuracy"] > 0.3
    assert not (job.state_dir / "pending").exists() or not any(
        (job.state_dir / "pending").iterdir()
    )  # nothing kept per upload: a SecAgg+ round is all or nothing


def test_a_checkpoint_is_continued_only_in_the_mode_that_wrote_it(
    cache: Path, tmp_path: Path
) -> None:
    """A plain run's checkpoint is never continued under SecAgg+ (its uploads
    were seen), nor a secure run's by a plain loop: the record would lie."""
    job = fedavg_job(cache)
    job.state_dir = tmp_path
    transport = SecAggPlusTransport(
        None,  # type: ignore[arg-type]
        {},
        "j",
        SecAggPlusConfig(),
        1.0,
        num_classes=10,
    )
    saved = Resume(job_digest(job), 1, job.method.init_state(), [], {}, {}, {})
    RoundCheckpoints(tmp_path).save(saved)
    with pytest.raises(DataError, match="saved by job"):
        RoundLoop(job, transport).execute()
    RoundCheckpoints(tmp_path).save(
        Resume(secure_checkpoint_digest(job_digest(job)), 1, saved.state, [], {}, {}, {})
    )
    with pytest.raises(DataError, match="saved by job"):
        RoundLoop(job, InProcessClients(job)).execute()


SITE_CLASSES = [str(i) for i in range(10)]


@pytest.fixture(scope="module")
def site_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sites' image folders (train/ and test/), every third digit each."""
    from PIL import Image

    from osfl.data.sources import load_data

    root = tmp_path_factory.mktemp("secagg-sites")
    splits = load_data("digits", image_size=8, max_per_class=60)
    for part, images in (("train", splits.train), ("test", splits.test)):
        for i in range(len(images)):
            folder = root / f"site{i % 3}" / part / SITE_CLASSES[int(images.labels[i])]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images.images[i, 0].numpy()).save(folder / f"{i}.png")
    return root


def test_real_sites_train_under_secaggplus_and_score_the_final_model(site_folders: Path) -> None:
    """Each site reads its own folder (node config ``data``), the server holds
    no data and no test set: it sums the masked vectors, and the sites score
    the released model (``Transport.evaluate``, the plain GridTransport's)."""
    from osfl import site_assembly
    from osfl.assembly import load_experiment
    from osfl.config import load_config, to_yaml

    cfg = load_config(
        None,
        [
            *TINY_GREY,
            f"data.classes={json.dumps(SITE_CLASSES)}",
            "transform.mean=[0.3]",
            "transform.std=[0.3]",
            "methods=[fedavg]",
            "train.epochs=5",
            "train.batch_size=16",
            "train.optimizer=sgdm",
            "train.lr=0.05",
            "cache_dir=null",
        ],
    )
    spec = JobSpec(experiment=to_yaml(cfg), sites=True)
    nodes = [{"data": f"imagefolder:{site_folders / f'site{s}'}"} for s in range(3)]
    builder = site_assembly.job_for_spec
    app = add_secure_train(make_client_app(builder), builder)
    grid = LoopbackGrid(app, 3, run_config=spec.to_run_config(), node_configs=nodes)
    job = site_assembly.site_server_job(*load_experiment(spec))
    assert job.evaluate_at_clients and job.clients.size(0) is None
    config = SecAggPlusConfig(max_weight=256)  # the server cannot know the sites' sizes
    with loopback_identity():
        result = execute_secure(grid, job, config, weighting="data_size", node_timeout=10)

    (record,) = result.rounds
    assert record.accepted == [0, 1, 2] and record.refused == {}
    sizes = [len(list((site_folders / f"site{s}" / "train").rglob("*.png"))) for s in range(3)]
    tests = [len(list((site_folders / f"site{s}" / "test").rglob("*.png"))) for s in range(3)]
    assert max(sizes) <= 256
    m = result.metrics
    assert set(m["site_accuracies"]) == {"0", "1", "2"} and m["num_samples"] == sum(tests)
    assert m["bytes_down_evaluation"] > 0
    assert m["global_test_accuracy"] > 0.1 + 0.15  # well above chance


# --------------------------------------------------------------------------- units
def test_secure_refusal_names_what_reads_individual_uploads() -> None:
    assert secure_refusal("fedavg", "data_size", ServerConfig()) is None
    assert "individual uploads" in (secure_refusal("ensemble", None, ServerConfig()) or "")
    assert "server.aggregator=mean" in (
        secure_refusal("fedavg", "uniform", ServerConfig(aggregator="median")) or ""
    )
    assert "member_filter" in (
        secure_refusal("fedavg", "data_size", ServerConfig(member_filter="finite")) or ""
    )
    assert "max_update_norm" in (
        secure_refusal("fedavg", "data_size", ServerConfig(max_update_norm=10.0)) or ""
    )
    with pytest.raises(ConfigError, match="secure weighting"):
        secure_refusal("fedavg", "median_of_counts", ServerConfig())


def test_the_config_half_imports_without_flower() -> None:
    """``osfl.config`` may hold a SecAggPlusConfig without importing flwr."""
    code = (
        "import sys, osfl.fl.secagg_config\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'flwr')\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _layout() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    spec = UploadSpec(
        tensors={"w": TensorSpec((2, 2), torch.float32), "n": TensorSpec((), torch.int64)},
        meta={"num_samples": NUM_SAMPLES},
    )
    return layout_of({0: spec, 1: spec})


def test_plan_gives_exact_weights_the_finest_grid_and_scaled_counters() -> None:
    plan = plan_round(SecAggPlusConfig(), _layout(), {0: 300, 1: 200, 2: 100}, "data_size")
    assert (plan.max_weight, plan.quantization_bits) == (512, 30)
    assert plan.scales["w"] == 1.0 and plan.scales["n"] > 1.0
    assert plan.scales["n"] * plan.error(600) <= 1 / 8  # the rounded counter stays exact
    assert math.log2(plan.scales["n"]).is_integer()
    assert QuantizationPlan.from_json(plan.to_json(), client=0) == plan
    wide = plan_round(SecAggPlusConfig(), _layout(), dict.fromkeys(range(1000), 10), "uniform")
    assert wide.quantization_bits == 22  # 1000 clients: 1000 * 2**22 < 2**32
    assert wide.max_weight == 1  # uniform: every client weighs 1
    with pytest.raises(ConfigError, match="max_weight"):
        plan_round(SecAggPlusConfig(quantization_bits=8), _layout(), {0: 300, 1: 2}, "data_size")
    with pytest.raises(ConfigError, match="power of two"):
        SecAggPlusConfig(max_weight=1000)


def test_clients_refuse_what_the_mod_would_clip_or_corrupt() -> None:
    plan = plan_round(
        SecAggPlusConfig(clipping_range=1.0), _layout(), {0: 100, 1: 100}, "data_size"
    )
    ok = Upload({"w": torch.full((2, 2), 0.5), "n": torch.tensor(7)}, {"num_samples": 100})
    arrays, weight = secure_vector(ok, plan, client=0)
    assert weight == 100
    assert [a.shape for a in arrays] == [(1,), (4,)]  # sorted by name, flat (no 0-d arrays)
    assert arrays[0][0] == 7 / plan.scales["n"]
    cases = {
        "beyond SecAgg\\+'s clipping_range 1": {"w": torch.full((2, 2), 3.0)},
        "is not finite": {"w": torch.tensor([[0.0, float("nan")], [0.0, 0.0]])},
        "not the round's layout": {"v": torch.zeros(2, 2)},
    }
    for message, tensors in cases.items():
        bad = Upload({**ok.tensors, **tensors}, {"num_samples": 100})
        if "v" in tensors:
            bad.tensors.pop("w")
        with pytest.raises(UploadError, match=message):
            secure_vector(bad, plan, client=3)
    with pytest.raises(
        UploadError, match=r"weight 129 must be an integer in \[1, max_weight=128\]"
    ):
        secure_vector(Upload(ok.tensors, {"num_samples": 129}), plan, client=3)


def test_layouts_secagg_cannot_sum_are_refused() -> None:
    base = {"w": TensorSpec((2,), torch.float32)}
    with pytest.raises(ConfigError, match="num_samples"):
        layout_of({0: UploadSpec(tensors=base)})
    with pytest.raises(ConfigError, match="different tensor sets"):
        layout_of(
            {
                0: UploadSpec(tensors=base, meta={"num_samples": NUM_SAMPLES}),
                1: UploadSpec(tensors={"v": base["w"]}, meta={"num_samples": NUM_SAMPLES}),
            }
        )
    with pytest.raises(ConfigError, match="no fixed shape"):
        layout_of(
            {0: UploadSpec(tensors={"w": TensorSpec((None,))}, meta={"num_samples": NUM_SAMPLES})}
        )


def test_a_round_of_one_client_is_refused_and_no_upload_is_brought_back() -> None:
    transport = SecAggPlusTransport(
        None,  # type: ignore[arg-type]
        {0: 1, 1: 2},
        "j",
        SecAggPlusConfig(),
        1.0,
        num_classes=10,
    )
    with pytest.raises(ConfigError, match="at least 2 clients in a round"):
        transport.secure_mean(0, [0], b"", _layout(), {0: 10})
    with pytest.raises(UploadError, match=r"at least 2 clients with a SuperNode, got \[1\]"):
        transport.secure_mean(0, [1, 2], b"", _layout(), {1: 10, 2: 10})
    assert not hasattr(transport, "exchange")  # it sums; it never brings back an upload
    transport.restore({1: b"state"})  # each SuperNode keeps its own
    assert transport.client_states() == {}


# --------------------------------------------------------------------------- the config switch
def test_secagg_enabled_in_a_config_runs_the_rounds_under_secaggplus(cache: Path) -> None:
    """``osfl run runtime=flower secagg.enabled=true``: the loopback runtime runs
    SecAgg+ (the record says the server aggregated one mean), and its model
    scores as plain FedAvg's within the quantisation error."""
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    base = [
        *TINY_FLOWER,
        "train.epochs=1",
        "methods=[fedavg]",
        f"cache_dir={cache}",
        "progress=false",
    ]
    (plain,) = run_experiment(load_config(None, base))
    (secure,) = run_experiment(load_config(None, [*base, "runtime=flower", "secagg.enabled=true"]))
    assert secure["runtime"] == "flower"
    assert abs(secure["global_test_accuracy"] - plain["global_test_accuracy"]) <= 2 / 360
    assert secure["bytes_up"] > plain["bytes_up"]  # masked int vectors + the key stages


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["secagg.enabled=true", "methods=[fedavg]"], "secagg.enabled needs runtime=flower"),
        (  # the second method is refused before the first one trains
            ["runtime=flower", "secagg.enabled=true", "methods=[fedavg,ensemble]"],
            "method 'ensemble' needs the clients' individual uploads",
        ),
        (
            [
                "runtime=flower",
                "secagg.enabled=true",
                "methods=[fedavg]",
                "server.aggregator=median",
            ],
            "server.aggregator='median'",
        ),
    ],
)
def test_a_config_secagg_cannot_serve_is_refused_before_training(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    cfg = load_config(
        None, ["data.image_size=8", "partition.num_clients=3", "progress=false", *overrides]
    )
    trained = tmp_path / "cache"
    with pytest.raises(ConfigError, match=message):
        run_experiment(dataclasses.replace(cfg, cache_dir=str(trained)))
    assert not trained.exists() or not any(trained.rglob("*.safetensors"))


def test_an_audit_under_secagg_is_refused_when_the_config_loads() -> None:
    from osfl.config import load_config

    with pytest.raises(ConfigError, match="audit reads each client's upload"):
        load_config(None, ["runtime=flower", "secagg.enabled=true", "audit=[rlu]"])
