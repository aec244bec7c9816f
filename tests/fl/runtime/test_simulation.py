"""The simulation runtime: wire round trips, validation, observers, determinism."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from osfl.data.imageset import ImageSet
from osfl.data.partition import make_federation
from osfl.errors import UploadError
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.method import Method, MultiRound, Predictor, sample_fraction
from osfl.fl.observers import Observer
from osfl.fl.progress import Progress
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import NUM_SAMPLES, Broadcast, TensorSpec, Upload, UploadSpec
from support.progress import RecordingBoard


@dataclass(frozen=True)
class ToyConfig:
    rounds: int = 3
    client_fraction: float = 1.0
    bad_clients: tuple[int, ...] = ()


class ZeroPredictor(Predictor):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 4)


class Toy(Method, MultiRound):
    """w <- mean over clients of (w + noise from the client's generator + mean label)."""

    name: ClassVar[str] = "toy"
    Config: ClassVar[type] = ToyConfig

    def __init__(self, config: Any, run: RunContext):
        super().__init__(config, run)
        self.returned: list[Upload] = []  # the Upload objects the clients returned
        self.aggregated: list[tuple[int, list[int], list[Upload]]] = []  # round, clients, uploads

    @property
    def rounds(self) -> int:
        return self.config.rounds

    def sample_clients(self, round: int, num_clients: int, rng: Any) -> list[int]:
        return sample_fraction(self.config.client_fraction, round, num_clients, rng)

    def init_state(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(3)}

    def broadcast(self, state: dict[str, torch.Tensor], round: int) -> Broadcast:
        return Broadcast(tensors={"w": state["w"]}, meta={"round": round})

    def client_update(self, ctx: Any, broadcast: Broadcast, data: ImageSet) -> Upload:
        w = (
            broadcast.tensors["w"]
            + torch.rand(3, generator=ctx.generator)
            + data.labels.float().mean()
        )
        if ctx.client_id in self.config.bad_clients:
            w[0] = float("nan")
        up = Upload(tensors={"w": w}, meta={"num_samples": len(data)})
        self.returned.append(up)
        return up

    def upload_spec(self, state: Any, round: int, client: int) -> UploadSpec:
        return UploadSpec(
            tensors={"w": TensorSpec((3,), torch.float32)}, meta={"num_samples": NUM_SAMPLES}
        )

    def aggregate(
        self, state: Any, uploads: Mapping[int, Upload], round: int
    ) -> dict[str, torch.Tensor]:
        self.aggregated.append((round, list(uploads), list(uploads.values())))
        return {"w": torch.stack([u.tensors["w"] for u in uploads.values()]).mean(0)}

    def predictor(self, state: Any) -> Predictor:
        return ZeroPredictor()


class Recorder(Observer):
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.truths: dict[tuple[int, int], Any] = {}

    def on_run_start(self, method_name: str, run: RunContext) -> None:
        self.events.append(("start", method_name))

    def on_broadcast(self, round: int, client: int, broadcast: Broadcast, nbytes: int) -> None:
        self.events.append(("broadcast", round, client, nbytes, len(broadcast.to_bytes())))

    def on_upload(self, round, client, upload, nbytes, truth=None) -> None:
        self.events.append(("upload", round, client, nbytes, len(upload.to_bytes())))
        self.truths[(round, client)] = truth

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        self.events.append(("round_end", round, dict(metrics)))

    def on_run_end(self, result: Any) -> None:
        self.events.append(("end",))


@pytest.fixture(scope="module")
def tiny() -> tuple[ImageSet, Any, RunContext]:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(40) % 4
    images = torch.randint(0, 256, (40, 1, 4, 4), dtype=torch.uint8, generator=g)
    train = ImageSet(images, labels, classes=("a", "b", "c", "d"))
    fed = make_federation(labels, "iid", 4, seed=0)
    run = RunContext(
        num_classes=4,
        image_shape=(1, 4, 4),
        num_clients=4,
        model=ModelSpec("cnn_small"),
        train=TrainConfig(),
        train_transform=None,  # type: ignore[arg-type]
        eval_transform=None,  # type: ignore[arg-type]
        seed=7,
    )
    return train, fed, run


def simulate(tiny, progress: Progress | None = None, **kw: Any) -> tuple[Toy, Any]:
    train, fed, run = tiny
    if progress is not None:
        run = dataclasses.replace(run, progress=progress)
    cfg_keys = {"rounds", "client_fraction", "bad_clients"}
    method = Toy(ToyConfig(**{k: v for k, v in kw.items() if k in cfg_keys}), run)
    rest = {k: v for k, v in kw.items() if k not in cfg_keys}
    return method, run_simulation(method, run, train, fed, **rest)


def test_every_message_crosses_the_wire_and_bytes_are_exact(tiny):
    rec = Recorder()
    method, res = simulate(tiny, observers=[rec])
    # the server aggregates parsed copies, never the objects the clients returned
    seen = {id(u) for _, _, ups in method.aggregated for u in ups}  # all kept alive
    assert seen.isdisjoint(id(u) for u in method.returned)
    ups = [e for e in rec.events if e[0] == "upload"]
    downs = [e for e in rec.events if e[0] == "broadcast"]
    assert len(ups) == len(downs) == 3 * 4
    assert all(e[3] == e[4] for e in ups + downs)  # nbytes == len(to_bytes())
    assert res.bytes_up == sum(e[3] for e in ups)
    assert res.bytes_down == sum(e[3] for e in downs)
    assert sum(r.bytes_up for r in res.rounds) == res.bytes_up
    assert sum(r.bytes_down for r in res.rounds) == res.bytes_down
    assert set(res.time_s) == {"client", "server", "eval", "total"}


def test_observer_hook_order_and_truth(tiny):
    train, fed, _ = tiny
    rec = Recorder()
    simulate(tiny, rounds=2, observers=[rec])
    kinds = [e[0] for e in rec.events]
    per_round = ["broadcast"] * 4 + ["upload"] * 4 + ["round_end"]
    assert kinds == ["start", *per_round, *per_round, "end"]
    assert rec.events[0] == ("start", "toy")
    for (_, c), truth in rec.truths.items():
        assert truth["num_classes"] == 4
        assert torch.equal(
            truth["labels"], train.labels[torch.as_tensor(np.array(fed.client_indices[c]))]
        )


def test_refused_upload_is_dropped_and_round_goes_on(tiny, caplog):
    with caplog.at_level(logging.WARNING, logger="osfl.fl.runtime.rounds"):
        method, res = simulate(tiny, rounds=2, bad_clients=(1,))
    assert [clients for _, clients, _ in method.aggregated] == [[0, 2, 3], [0, 2, 3]]
    for r in res.rounds:
        assert r.accepted == [0, 2, 3]
        assert set(r.refused) == {1}
        assert "client 1" in r.refused[1] and "'w'" in r.refused[1] and "NaN" in r.refused[1]
        assert r.bytes_refused > 0
    assert res.refused[0][:2] == (0, 1)
    assert "upload refused" in caplog.text and "client 1" in caplog.text
    assert bool(torch.isfinite(res.state["w"]).all())


def test_all_uploads_refused_is_an_error(tiny):
    with pytest.raises(UploadError, match="every upload was refused"):
        simulate(tiny, rounds=1, bad_clients=(0, 1, 2, 3))


def test_deterministic_for_a_seed(tiny):
    _, a = simulate(tiny, seed=3)
    _, b = simulate(tiny, seed=3)
    _, c = simulate(tiny, seed=4)
    assert torch.equal(a.state["w"], b.state["w"])
    assert not torch.equal(a.state["w"], c.state["w"])


def test_client_sampling_fraction_is_seeded(tiny):
    _, r1 = simulate(tiny, rounds=4, client_fraction=0.5, seed=1)
    _, r2 = simulate(tiny, rounds=4, client_fraction=0.5, seed=1)
    picks = [r.clients for r in r1.rounds]
    assert picks == [r.clients for r in r2.rounds]
    assert all(len(p) == 2 and p == sorted(p) for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # not the same pair every round


def test_parallel_clients_equal_sequential(tiny):
    _, seq = simulate(tiny, seed=5)
    _, par = simulate(tiny, seed=5, parallel_clients=3)
    assert torch.equal(seq.state["w"], par.state["w"])
    assert [r.accepted for r in seq.rounds] == [r.accepted for r in par.rounds]
    with pytest.raises(ValueError):
        simulate(tiny, parallel_clients=0)
    with pytest.raises(ValueError):
        simulate(tiny, threads_per_client=0)


def test_evaluator_and_intermediate_rounds(tiny):
    calls = []

    def evaluator(pred: Predictor) -> dict[str, float]:
        calls.append(pred)
        return {"global_test_accuracy": 0.25}

    _, res = simulate(tiny, rounds=4, evaluator=evaluator, eval_every=2)
    assert [bool(r.metrics) for r in res.rounds] == [False, True, False, True]
    assert res.metrics == {"global_test_accuracy": 0.25}
    assert len(calls) == 2
    assert res.rounds[-1].as_dict()["metrics"] == {"global_test_accuracy": 0.25}


def test_progress_shows_rounds_and_clients_and_closes_every_bar(tiny):
    board = RecordingBoard(enabled=True)
    _, res = simulate(tiny, rounds=2, progress=board)
    assert len(res.rounds) == 2
    described = {b.name: (b.total, sum(b.advances), b.closed) for b in board.bars}
    assert described["toy: rounds"] == (2, 2, True)
    assert described["toy: round 1/2, clients"] == (4, 4, True)
    assert described["toy: round 2/2, clients"] == (4, 4, True)


def test_real_fedavg_parallel_equals_sequential(digits_run):
    """Multi-round FedAvg with a BatchNorm CNN: thread-parallel clients give the
    same numbers as sequential ones with the same torch threads per client."""
    from osfl.methods.fedavg import FedAvg, FedAvgConfig

    train, fed, run = digits_run
    cfg = FedAvgConfig(rounds=2)
    before = torch.get_num_threads()
    kw = {"threads_per_client": 1}
    seq = run_simulation(FedAvg(cfg, run), run, train, fed, **kw)
    par = run_simulation(FedAvg(cfg, run), run, train, fed, parallel_clients=2, **kw)
    assert torch.get_num_threads() == before  # restored
    assert seq.state.keys() == par.state.keys()
    for k in seq.state:
        assert torch.equal(seq.state[k], par.state[k]), k


@pytest.fixture(scope="module")
def digits_run() -> tuple[ImageSet, Any, RunContext]:
    from osfl.data.sources import load_data
    from osfl.data.transforms import build_transform, channel_stats

    train = load_data("digits", max_per_class=20).train
    fed = make_federation(train.labels, "dirichlet", 3, seed=0, alpha=1.0)
    mean, std = channel_stats(train)
    tf = build_transform("none", image_size=8, mean=mean, std=std)
    run = RunContext(
        num_classes=10,
        image_shape=train.image_shape,
        num_clients=3,
        model=ModelSpec("cnn_small", {"in_chans": 1, "width": 8}),
        train=TrainConfig(epochs=1, batch_size=16, optimizer="sgdm", lr=0.05),
        train_transform=tf,
        eval_transform=tf,
        seed=0,
    )
    assert np.all(fed.sizes > 0)
    return train, fed, run
