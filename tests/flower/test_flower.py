"""The Flower runtime: wire records, job specs, the ServerApp/ClientApp message
flow (in-process LoopbackGrid: Flower's real apps and wire encoding, no
transport) equal to the simulation, refusals, discovery errors (the app
directory and the apps' log stream: ``tests/flower_app/``) — and, marked slow, real ``flower-superlink`` / ``flower-supernode``
processes on loopback launched with ``flwr run``
(``pytest -m slow tests/flower/test_flower.py``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from osfl.errors import ConfigError, UploadError
from osfl.fl.progress import ProgressTask
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.upload import Broadcast, Upload
from osfl.flower import records as rec
from osfl.flower.client import make_client_app, partition_id
from osfl.flower.grid import (
    DiscoveryError,
    FlowerGridRuntime,
    GridTransport,
    discover_clients,
    make_server_app,
)
from osfl.flower.loopback import (
    FlowerLoopbackRuntime,
    LoopbackGrid,
    loopback_identity,
    wire_roundtrip,
)
from osfl.flower.spec import JobSpec, job_digest
from support.flower_toy import toy_job
from support.tiny import TINY_FLOWER


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Any:
    """One torch thread while this file runs (restored after): the tiny models
    here gain nothing from more, and on a busy 2-core machine the OpenMP
    threads of several processes fight each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_both(job: Job) -> tuple[Any, Any]:
    return SimulationRuntime().execute(job), FlowerLoopbackRuntime().execute(job)


# --------------------------------------------------------------------------- wire records
def test_envelope_survives_flower_wire_encoding_including_chunking() -> None:
    payload = Broadcast(tensors={"w": torch.arange(5.0)}, meta={"k": 1}).to_bytes()
    big = bytes(range(256)) * (6 * 4096 + 7)  # > 5 MiB: split into several ArrayChunks
    with loopback_identity():
        for data in (payload, big):
            env = rec.Envelope(data, round=2, client=1, job="abc")
            msg = Message(rec.pack(env), dst_node_id=7, message_type=rec.MSG_TRAIN)
            back, nbytes = wire_roundtrip(msg)
            assert rec.unpack(back.content) == env
            assert nbytes > len(data)  # the payload plus Flower's object headers
    got = Broadcast.from_bytes(rec.unpack(rec.pack(rec.Envelope(payload, 0, 0, "j"))).payload)
    assert torch.equal(got.tensors["w"], torch.arange(5.0)) and got.meta == {"k": 1}


def test_unpack_refuses_malformed_records_naming_the_client() -> None:
    good = rec.pack(rec.Envelope(b"xyz", 0, 2, "j"))
    with pytest.raises(UploadError, match=r"\[client 2\].*lacks the 'osfl.payload' record"):
        rec.unpack(RecordDict({rec.META_RECORD: good.config_records[rec.META_RECORD]}), client=2)
    meta = ConfigRecord({"round": "0", "client": 2, "job": "j"})
    bad = RecordDict(
        {rec.PAYLOAD_RECORD: good.array_records[rec.PAYLOAD_RECORD], rec.META_RECORD: meta}
    )
    with pytest.raises(UploadError, match=r"osfl\.meta\.round must be a int"):
        rec.unpack(bad, client=2)
    with pytest.raises(UploadError, match="partition-id"):
        rec.read_whoami(RecordDict({}))


def test_jobspec_round_trips_through_run_config_and_refuses_bad_values() -> None:
    spec = JobSpec(
        experiment="/x/cfg.yaml",
        method="fedavg",
        seed=4,
        overrides=("a.b=1", "c='x y'"),
        out_dir="/tmp/out",
        round_timeout=30.0,
        node_timeout=5.0,
    )
    assert JobSpec.from_run_config(spec.to_run_config()) == spec
    assert JobSpec.from_run_config({}) == JobSpec()
    assert JobSpec.from_run_config({"seed": -1}).seed is None
    assert JobSpec.from_run_config({"round-timeout": 7}).round_timeout == 7.0
    with pytest.raises(ConfigError, match="'seed' must be a int"):
        JobSpec.from_run_config({"seed": "3"})
    with pytest.raises(ConfigError, match="positive"):
        JobSpec(node_timeout=0)


def test_partition_id_comes_from_node_config() -> None:
    ctx = Context(
        run_id=1, node_id=5, node_config={"partition-id": 2}, state=RecordDict(), run_config={}
    )
    assert partition_id(ctx) == 2
    ctx.node_config = {}
    with pytest.raises(ConfigError, match="--node-config 'partition-id=<client id>'"):
        partition_id(ctx)


# --------------------------------------------------------------------------- equality with simulation
def test_flower_message_flow_equals_simulation_exactly() -> None:
    job = toy_job(client_fraction=0.67)  # 2 of 3 clients a round: sampling must match too
    sim, flw = run_both(job)
    assert torch.equal(sim.state, flw.state)
    assert sim.metrics == flw.metrics and "score" in flw.metrics
    assert [r.clients for r in sim.rounds] == [r.clients for r in flw.rounds]
    assert all(len(r.clients) == 2 for r in flw.rounds)
    assert (sim.bytes_up, sim.bytes_down) == (flw.bytes_up, flw.bytes_down) and flw.bytes_up > 0
    assert [r.bytes_up for r in sim.rounds] == [r.bytes_up for r in flw.rounds]


def test_invalid_upload_is_dropped_with_reason_and_run_goes_on() -> None:
    sim, flw = run_both(toy_job(nan_clients=(1,)))
    for res in (sim, flw):
        assert all(r.accepted == [0, 2] for r in res.rounds)
        assert all("[client 1, field 'w'] contains NaN" in r.refused[1] for r in res.rounds)
    assert torch.equal(sim.state, flw.state) and bool(torch.isfinite(flw.state).all())


def test_client_exception_becomes_error_reply_and_client_is_dropped() -> None:
    flw = FlowerLoopbackRuntime().execute(toy_job(crash_client=0))
    assert all(r.accepted == [1, 2] for r in flw.rounds)
    assert "RuntimeError: disk full" in flw.rounds[0].refused[0]


def test_every_upload_refused_is_an_error() -> None:
    with pytest.raises(UploadError, match="round 0: every upload was refused"):
        FlowerLoopbackRuntime().execute(toy_job(nan_clients=(0, 1, 2)))


def _grid(job: Job, nodes: int = 3, builder: Any = None) -> LoopbackGrid:
    return LoopbackGrid(make_client_app(builder or (lambda s: job), JobSpec()), nodes)


def test_grid_runtime_refuses_nodes_built_with_another_method_config() -> None:
    job = toy_job(rounds=1)
    grid = _grid(job, builder=lambda s: toy_job(s, rounds=2))
    with loopback_identity(), pytest.raises(ConfigError, match="method_config: here"):
        FlowerGridRuntime(grid).execute(job)


# --------------------------------------------------------------------------- discovery
def test_discovery_maps_partition_ids_to_nodes() -> None:
    job = toy_job()
    grid = _grid(job)
    with loopback_identity():
        nodes = discover_clients(grid, job, job_digest(job), timeout=5)
    assert sorted(nodes) == [0, 1, 2] and sorted(nodes.values()) == sorted(grid.get_node_ids())


def test_discovery_goes_on_with_the_nodes_that_connected() -> None:
    """A site that never starts is a dropout: with ``server.min_clients`` (1)
    met, the run maps the nodes that did connect and client 2 has none."""
    job = toy_job()
    with loopback_identity():
        nodes = discover_clients(_grid(job, 2), job, job_digest(job), timeout=0.2)
    assert sorted(nodes) == [0, 1]


def test_discovery_names_the_part_that_differs() -> None:
    job = toy_job(seed=3)
    grid = _grid(job, builder=lambda s: toy_job(s, seed=4))
    assert job_digest(job) != job_digest(toy_job(seed=4))
    with loopback_identity(), pytest.raises(ConfigError, match=r"seed: here 4 vs server 3"):
        discover_clients(grid, job, job_digest(job), timeout=5)


def test_node_with_out_of_range_partition_id_is_refused() -> None:
    job = toy_job()
    with loopback_identity():  # node 3 has no client: logged, the run has its 3 clients
        nodes = discover_clients(_grid(job, 4), job, job_digest(job), timeout=5)
    assert sorted(nodes) == [0, 1, 2]


def test_two_nodes_claiming_one_partition_id_are_refused() -> None:
    job = toy_job()
    grid = _grid(job)
    first, second = list(grid._contexts.values())[:2]
    second.node_config = {**second.node_config, "partition-id": 0}  # a copy of node 0
    with loopback_identity(), pytest.raises(ConfigError, match=r"both claim partition-id 0"):
        discover_clients(grid, job, job_digest(job), timeout=0.5)
    assert first.node_config["partition-id"] == 0


def test_a_node_that_refuses_the_job_is_named_without_the_start_a_supernode_hint() -> None:
    """Nodes that refuse the job (here: every node's data holds a foreign
    class) are the whole story: their reason once, and no "start one
    flower-supernode per client" hint, which is only for nodes that never
    answered."""
    job = toy_job()

    def foreign_class(spec: JobSpec) -> Job:
        raise ConfigError("data 'imagefolder:/srv/x': class(es) 'cat' are foreign")

    grid = _grid(job, builder=foreign_class)
    with loopback_identity(), pytest.raises(DiscoveryError) as info:
        discover_clients(grid, job, job_digest(job), timeout=5)
    line = str(info.value)
    assert line.startswith("client(s) [0, 1, 2] of 3 have no usable node: nodes ")
    assert line.count("'cat' are foreign") == 1 and "flower-supernode" not in line
    unreachable = DiscoveryError([2], 3, [], ["node 9: unreachable"])
    assert str(unreachable).startswith("no usable SuperNode for client(s) [2] of 3 (node 9: ")
    assert "start one flower-supernode per client" in str(unreachable)


# --------------------------------------------------------------------------- wire refusals
class _Counting(ProgressTask):
    def __init__(self) -> None:
        self.n = 0

    def advance(self, amount: float = 1.0, *, description: str | None = None) -> None:
        self.n += 1


def _node_reply(job: Job, *, client: int, digest: str) -> Message:
    """Node 0's reply to a train message addressed to ``client`` of job ``digest``."""
    grid = _grid(job)
    payload = job.method.broadcast(job.method.init_state(), 0).to_bytes()
    env = rec.Envelope(payload, 0, client, digest)
    with loopback_identity():
        node0 = min(grid.get_node_ids())
        msg = Message(rec.pack(env), dst_node_id=node0, message_type=rec.MSG_TRAIN, group_id="0")
        (reply,) = grid.send_and_receive([msg])
    return reply


def test_node_refuses_a_message_for_another_client() -> None:
    job = toy_job()
    reply = _node_reply(job, client=2, digest=job_digest(job))
    assert reply.has_error() and "addressed client 2 to this node, which is partition-id 0" in (
        reply.error.reason
    )


def test_node_refuses_a_message_of_another_job() -> None:
    job = toy_job()
    reply = _node_reply(job, client=0, digest="0123456789abcdef")
    assert reply.has_error() and "server runs job 0123456789abcdef" in reply.error.reason


def test_server_refuses_replies_for_another_client_round_or_job() -> None:
    """A reply whose envelope names another client, round or job is dropped with
    the reason (a confused or hostile node cannot slip its upload in)."""
    job = toy_job()
    digest = job_digest(job)
    up = Upload({"w": torch.zeros(3)}, {"num_samples": 4}).to_bytes()

    class Forging(LoopbackGrid):
        def __init__(self, wrong: dict[str, Any]):
            super().__init__(make_client_app(lambda s: job, JobSpec()), 3)
            self.wrong = wrong

        def pull_messages(self, message_ids: Any) -> Any:
            out = []
            for reply in super().pull_messages(message_ids):
                if reply.metadata.message_type != rec.MSG_TRAIN:
                    out.append(reply)  # discovery replies pass unchanged
                    continue
                env = rec.unpack(reply.content)
                fields = {"round": env.round, "client": env.client, "job": env.job, **self.wrong}
                forged = rec.Envelope(up, fields["round"], fields["client"], fields["job"])
                reply.content = rec.pack(forged)  # same sender, forged envelope
                out.append(reply)
            return out

    payload = job.method.broadcast(job.method.init_state(), 0).to_bytes()
    for wrong, words in (
        ({"client": 2}, "reply is for client 2"),
        ({"round": 5}, "round 5"),
        ({"job": "feedfacefeedface"}, "job feedfacefeedface"),
    ):
        grid = Forging(wrong)
        with loopback_identity():
            nodes = discover_clients(grid, job, digest, timeout=5)
            turns = GridTransport(grid, nodes, digest, 5, 10).exchange(0, [0], payload, _Counting())
        assert turns[0].upload is None and words in (turns[0].failure or ""), wrong


def test_server_counts_a_missing_reply_as_a_timeout() -> None:
    job = toy_job()
    digest = job_digest(job)

    class Silent(LoopbackGrid):
        def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
            msgs = list(messages)
            if msgs and msgs[0].metadata.message_type == rec.MSG_TRAIN:
                return []  # no node answered within the round timeout
            return super().send_and_receive(msgs, timeout=timeout)

    grid = Silent(make_client_app(lambda s: job, JobSpec()), 3)
    payload = job.method.broadcast(job.method.init_state(), 0).to_bytes()
    with loopback_identity():
        nodes = discover_clients(grid, job, digest, timeout=5)
        task = _Counting()
        turns = GridTransport(grid, nodes, digest, 7, 10).exchange(0, [0, 1], payload, task)
    assert all(
        t.upload is None and "no reply within 7 s" in (t.failure or "") for t in turns.values()
    )
    assert task.n == 2


# --------------------------------------------------------------------------- experiment jobs
def _tiny_overrides() -> tuple[str, ...]:
    return (
        *TINY_FLOWER,
        "train.steps=2",
        "train.batch_size=16",
        "method.fedavg.rounds=2",
        "cache_dir=null",
    )


@pytest.fixture(scope="module")
def sim_fedavg_record() -> dict[str, Any]:
    """The simulation's record of the tiny two-round FedAvg job (computed once)."""
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    (record,) = run_experiment(load_config(None, [*_tiny_overrides(), "methods=[fedavg]"]))
    return record


def test_experiment_server_app_writes_the_simulation_record(
    tmp_path: Path, sim_fedavg_record: dict[str, Any]
) -> None:
    from osfl.assembly import job_from_spec
    from osfl.flower_app.apps import serve_experiment

    spec = JobSpec(method="fedavg", overrides=_tiny_overrides(), out_dir=str(tmp_path / "run"))
    got: list[dict[str, Any]] = []
    server = make_server_app(lambda grid, s: got.append(serve_experiment(grid, s)[1]))
    grid = LoopbackGrid(make_client_app(job_from_spec), 3, run_config=spec.to_run_config())
    ctx = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=spec.to_run_config()
    )
    with loopback_identity():
        server(grid, ctx)
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert doc["runtime"] == "flower" and doc["records"][0]["runtime"] == "flower"
    assert (tmp_path / "run" / "summary.md").is_file()
    flw, sim = got[0], sim_fedavg_record
    assert flw["rounds"] == 2
    for key in ("global_test_accuracy", "per_class_accuracy", "bytes_up", "bytes_down", "rounds"):
        assert flw[key] == sim[key], key


def test_experiment_server_app_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}")
    from osfl.assembly import job_from_spec
    from osfl.flower_app.apps import server_app

    spec = JobSpec(method="fedavg", overrides=_tiny_overrides(), out_dir=str(tmp_path / "run"))
    grid = LoopbackGrid(make_client_app(job_from_spec), 3, run_config=spec.to_run_config())
    ctx = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=spec.to_run_config()
    )
    with loopback_identity(), pytest.raises(ConfigError, match=r"already holds a metrics\.json"):
        server_app(grid, ctx)
    assert (tmp_path / "run" / "metrics.json").read_text() == "{}"


def test_runtime_flower_in_osfl_run_equals_simulation(sim_fedavg_record: dict[str, Any]) -> None:
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    cfg = load_config(None, [*_tiny_overrides(), "methods=[fedavg]", "runtime=flower"])
    (flw,) = run_experiment(cfg)
    sim = sim_fedavg_record
    assert flw["global_test_accuracy"] == sim["global_test_accuracy"]
    assert (flw["bytes_up"], flw["bytes_down"]) == (sim["bytes_up"], sim["bytes_down"])


def test_flower_simulation_without_ray_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from osfl.assembly import job_from_spec
    from osfl.flower.engine import FlowerEngineRuntime

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'flwr\[simulation\]'"):
        FlowerEngineRuntime(job_from_spec, JobSpec())


# --------------------------------------------------------------------------- real processes (slow)
@pytest.mark.slow
def test_real_superlink_and_supernodes_match_simulation(tmp_path: Path) -> None:
    """flower-superlink + 3 flower-supernode processes on loopback, `flwr run`
    for one-shot FedAvg and Ensemble on digits: the same accuracy (and bytes)
    as the simulation. Both sides train with one torch thread (the thread
    count changes CPU reductions in the last bits)."""
    from osfl.config import load_config
    from osfl.experiment import run_experiment
    from osfl.flower_app.local import LocalFederation, descendants

    overrides = (
        "partition.num_clients=3",
        "train.epochs=2",
        f"cache_dir={tmp_path / 'flower-cache'}",
    )
    records = {}
    fed = LocalFederation(3, tmp_path / "fed", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    with fed:
        pids = [p.pid for p in fed.procs]
        for method in ("fedavg", "ensemble"):
            spec = JobSpec(method=method, overrides=overrides, out_dir=str(tmp_path / method))
            out = fed.run(spec, timeout=900)
            records[method] = json.loads((out / "metrics.json").read_text())["records"][0]
        tree = [pid for p in pids for pid in [p, *descendants(p)]]
    alive = [_describe(pid) for pid in tree if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    assert not alive, f"processes left running: {alive}"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config(None, [*overrides[:-1], "cache_dir=null", "methods=[fedavg,ensemble]"])
        sim = {r["method"]: r for r in run_experiment(cfg)}
    finally:
        torch.set_num_threads(threads)
    for method in ("fedavg", "ensemble"):
        f, s = records[method], sim[method]
        assert f["runtime"] == "flower"
        assert f["global_test_accuracy"] == s["global_test_accuracy"], method
        assert f["per_class_accuracy"] == s["per_class_accuracy"], method
        assert (f["bytes_up"], f["bytes_down"]) == (s["bytes_up"], s["bytes_down"]), method
    for method in ("fedavg", "ensemble"):  # chance is 0.1
        assert records[method]["global_test_accuracy"] > 0.2, method


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return f"{pid} (gone)"
    return f"{pid} [{state}] {cmd}"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.slow
def test_flower_simulation_engine_matches_simulation(tmp_path: Path) -> None:
    """The same apps on Flower's own simulation engine (Ray, when installed):
    every actor builds the job from the config, as a SuperNode does."""
    pytest.importorskip("ray")
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    cfg = load_config(None, [*_tiny_overrides(), "methods=[fedavg]"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # Ray gives each actor one CPU: one torch thread
    try:
        (engine,) = run_experiment(dataclasses.replace(cfg, runtime="flower_engine"))
        (sim,) = run_experiment(cfg)
    finally:
        torch.set_num_threads(threads)
    assert engine["global_test_accuracy"] == sim["global_test_accuracy"]
    assert engine["bytes_up"] == sim["bytes_up"]


@pytest.mark.slow
def test_the_documented_engine_command_matches_the_simulation(tmp_path: Path) -> None:
    """The command of the README / docs/flower.md (fewer rounds) through the
    CLI: 10 ClientApp actors, each building its job once; the in-process
    runtime at one torch thread per client gives the same numbers."""
    pytest.importorskip("ray")
    from osfl.cli import main

    args = [
        "methods=[fedavg]",
        "method.fedavg.rounds=3",
        "partition.num_clients=10",
        "train.epochs=2",
        f"cache_dir={tmp_path / 'cache'}",
        "--no-progress",
    ]
    assert main(["run", *args, "runtime=flower_engine", "--out", str(tmp_path / "eng")]) == 0
    assert main(["run", *args, "threads_per_client=1", "--out", str(tmp_path / "sim")]) == 0
    eng, sim = (
        json.loads((tmp_path / d / "metrics.json").read_text())["records"][0]
        for d in ("eng", "sim")
    )
    assert eng["runtime"] == "flower_engine"
    for key in ("global_test_accuracy", "per_class_accuracy", "bytes_up", "bytes_down"):
        assert eng[key] == sim[key], key
