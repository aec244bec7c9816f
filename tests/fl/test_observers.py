"""Observers and Observations: byte accounting, recording, save/load, checkpoints
(osfl.fl.observers, osfl.fl.observation)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from osfl.errors import ConfigError, DataError
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.observation import Observation, load_observations
from osfl.fl.observers import (
    CHECKPOINT_KEY,
    ByteCounter,
    Checkpointer,
    ObservationRecorder,
    Observer,
    Observers,
)
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import Broadcast, Upload


def bcast(value: float = 1.0) -> Broadcast:
    return Broadcast(tensors={"w": torch.full((2, 3), value), "b": torch.zeros(3)})


def upload(client: int) -> Upload:
    return Upload(
        tensors={"w": torch.full((2, 3), float(client))}, meta={"num_samples": 10 + client}
    )


def drive(observer: Observer, rounds: int = 2, clients: tuple[int, ...] = (0, 1, 2)) -> None:
    """Play a runtime: per round one broadcast to each client, then the uploads."""
    for r in range(rounds):
        b = bcast(float(r))
        for c in clients:
            # the simulation runtime parses a fresh Broadcast per client
            observer.on_broadcast(r, c, Broadcast.from_bytes(b.to_bytes()), b.nbytes)
        for c in clients:
            up = upload(c)
            truth = {"labels": torch.tensor([c, c, 1]), "num_classes": 3}
            observer.on_upload(r, c, up, up.nbytes, truth)
        observer.on_round_end(r, {"w": b.tensors["w"]}, {"acc": 0.5})


# --- ByteCounter ----------------------------------------------------------------------


def test_byte_counter_is_exact() -> None:
    counter = ByteCounter()
    drive(counter)
    down, ups = bcast().nbytes, [upload(c).nbytes for c in range(3)]
    assert counter.total_down == 2 * 3 * down
    assert counter.total_up == 2 * sum(ups)
    assert counter.per_round("up") == {0: sum(ups), 1: sum(ups)}
    assert counter.per_client("up") == {c: 2 * ups[c] for c in range(3)}
    assert counter.per_client("down") == {c: 2 * down for c in range(3)}
    d = counter.as_dict()
    assert d["bytes_up"] == counter.total_up and d["bytes_up_per_client"]["2"] == 2 * ups[2]
    json.dumps(d)  # JSON-able
    with pytest.raises(ValueError, match="direction"):
        counter.per_round("sideways")


def test_observers_fan_out_in_order() -> None:
    log: list[tuple[str, str]] = []

    class Log(Observer):
        def __init__(self, name: str):
            self.name = name

        def on_run_start(self, method_name: str, run: Any) -> None:
            log.append((self.name, "start"))

        def on_broadcast(self, *a: Any) -> None:
            log.append((self.name, "broadcast"))

        def on_upload(self, *a: Any) -> None:
            log.append((self.name, "upload"))

        def on_round_end(self, *a: Any) -> None:
            log.append((self.name, "round_end"))

        def on_run_end(self, result: Any) -> None:
            log.append((self.name, "end"))

    fan = Observers([Log("a")])
    fan.append(Log("b"))
    fan.on_run_start("fedavg", None)
    drive(fan, rounds=1, clients=(0,))
    fan.on_run_end(None)
    names = ["start", "broadcast", "upload", "round_end", "end"]
    assert log == [(who, n) for n in names for who in ("a", "b")]
    drive(Observer(), rounds=1)  # the base class is a no-op everywhere


# --- ObservationRecorder ----------------------------------------------------------------


def test_recorder_in_memory() -> None:
    rec = ObservationRecorder(hparams={"lr": 0.1, "batch_size": 4})
    drive(rec)
    assert [(o.round, o.client_id) for o in rec.observations] == [
        (r, c) for r in range(2) for c in range(3)
    ]
    o = rec.for_client(2)[1]
    assert o.round == 1 and torch.equal(o.broadcast["w"], torch.full((2, 3), 1.0))
    assert torch.equal(o.upload["w"], torch.full((2, 3), 2.0))
    assert o.upload_meta == {"num_samples": 12} and o.hparams == {"lr": 0.1, "batch_size": 4}
    assert torch.equal(o.truth["labels"], torch.tensor([2, 2, 1])) and o.truth["num_classes"] == 3


def test_recorder_filters_clients_and_rounds() -> None:
    rec = ObservationRecorder(hparams={}, clients=[1], rounds=[1])
    drive(rec)
    assert [(o.round, o.client_id) for o in rec.observations] == [(1, 1)]


def test_recorder_takes_hparams_from_the_run() -> None:
    run = RunContext(
        num_classes=3,
        image_shape=(1, 4, 4),
        num_clients=3,
        model=ModelSpec("tiny"),
        train=TrainConfig(lr=0.05, batch_size=8, optimizer="sgd"),
        train_transform=None,
        eval_transform=None,
    )
    rec = ObservationRecorder()
    rec.on_run_start("fedavg", run)
    drive(rec, rounds=1, clients=(0,))
    hp = rec.observations[0].hparams
    assert hp["method"] == "fedavg" and hp["lr"] == 0.05 and hp["batch_size"] == 8
    assert hp["momentum"] == 0.0  # plain SGD applies no momentum


def test_recorder_on_disk_roundtrip(tmp_path) -> None:
    rec = ObservationRecorder(hparams={"lr": 0.1}, dir=tmp_path / "obs")
    drive(rec)
    # equal broadcasts to all clients of a round are stored once per round
    assert sorted(
        p.relative_to(tmp_path / "obs").as_posix()
        for p in (tmp_path / "obs").rglob("broadcast.safetensors")
    ) == [
        "round_000/broadcast.safetensors",
        "round_001/broadcast.safetensors",
    ]
    loaded = load_observations(tmp_path / "obs")
    assert len(loaded) == len(rec.observations) == 6
    for a, b in zip(rec.observations, loaded, strict=True):
        assert (a.client_id, a.round, a.upload_meta, a.hparams) == (
            b.client_id,
            b.round,
            b.upload_meta,
            b.hparams,
        )
        assert set(a.broadcast) == set(b.broadcast) and all(
            torch.equal(a.broadcast[k], b.broadcast[k]) for k in a.broadcast
        )
        assert torch.equal(a.upload["w"], b.upload["w"])
        assert torch.equal(a.truth["labels"], b.truth["labels"]) and b.truth["num_classes"] == 3


def test_personalised_broadcast_gets_its_own_copy(tmp_path) -> None:
    rec = ObservationRecorder(hparams={}, dir=tmp_path)
    rec.on_broadcast(0, 0, bcast(1.0), 0)
    rec.on_broadcast(0, 1, bcast(2.0), 0)
    rec.on_upload(0, 0, upload(0), 0)
    rec.on_upload(0, 1, upload(1), 0)
    assert (tmp_path / "round_000" / "broadcast.safetensors").exists()
    assert (tmp_path / "round_000" / "client_001" / "broadcast.safetensors").exists()
    loaded = load_observations(tmp_path)
    assert [float(o.broadcast["w"][0, 0]) for o in loaded] == [1.0, 2.0]
    assert loaded[0].truth is None


# --- Observation ------------------------------------------------------------------------


def test_observation_save_load(tmp_path) -> None:
    obs = Observation(
        client_id=4,
        round=2,
        broadcast={"w": torch.randn(3)},
        upload={"delta": torch.randn(2, 2), "n": torch.tensor([5])},
        upload_meta={"num_samples": 5},
        hparams={"lr": 0.1, "optimizer": "sgd", "epochs": 1},
        truth={"labels": torch.tensor([0, 2, 2]), "num_classes": 3},
    )
    back = Observation.load(obs.save(tmp_path / "o"))
    assert (back.client_id, back.round, back.upload_meta, back.hparams) == (
        4,
        2,
        {"num_samples": 5},
        obs.hparams,
    )
    assert torch.equal(back.broadcast["w"], obs.broadcast["w"])
    assert (
        torch.equal(back.upload["delta"], obs.upload["delta"])
        and back.upload["n"].dtype == torch.int64
    )
    assert torch.equal(back.truth["labels"], obs.truth["labels"]) and back.truth["num_classes"] == 3
    doc = json.loads((tmp_path / "o" / "observation.json").read_text())
    assert doc["hparams"]["lr"] == 0.1  # human-readable


def test_observation_refuses_bad_input(tmp_path) -> None:
    with pytest.raises(DataError, match="not JSON-able"):
        Observation(0, 0, upload_meta={"x": object()}).save(tmp_path / "a")
    with pytest.raises(DataError, match="not an observation directory"):
        Observation.load(tmp_path / "missing")
    Observation(0, 0).save(tmp_path / "b")
    doc = json.loads((tmp_path / "b" / "observation.json").read_text())
    doc["broadcast"] = "../../../../etc/broadcast.safetensors"
    (tmp_path / "b" / "observation.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="leaves the run"):
        Observation.load(tmp_path / "b")
    with pytest.raises(DataError, match="no observations"):
        load_observations(tmp_path / "nowhere")


# --- Checkpointer -----------------------------------------------------------------------


def test_checkpointer_every_k_rounds(tmp_path) -> None:
    ck = Checkpointer(tmp_path, every=2)
    for r in range(5):
        ck.on_round_end(r, {"model": {"w": torch.full((2,), float(r))}, "step": r}, {"acc": r / 10})
    assert [p.name for p in ck.saved] == ["round_001.safetensors", "round_003.safetensors"]
    state = load_file(str(tmp_path / "round_003.safetensors"))
    assert set(state) == {"model.w"} and torch.equal(state["model.w"], torch.full((2,), 3.0))
    with safe_open(str(tmp_path / "round_003.safetensors"), "pt") as f:
        assert f.metadata() == {CHECKPOINT_KEY: json.dumps({"metrics": {"acc": 0.3}, "round": 3})}
    assert not list(tmp_path.glob("*.tmp"))


def test_identical_rounds_keep_byte_identical_checkpoints(tmp_path) -> None:
    """safetensors orders a header of several keys by a hash map seeded anew
    for each file (two keys: either order, about half the time each): the
    checkpointer writes one key, so identical rounds give identical bytes."""
    digests = set()
    for i in range(12):
        ck = Checkpointer(tmp_path / str(i))
        state = {"b": torch.arange(3.0), "a": {"w": torch.ones(2, 2)}}
        ck.on_round_end(4, state, {"z": 1, "acc": 0.5, "m": [1, 2], "loss": 0.25})
        digests.add(hashlib.sha256(ck.saved[0].read_bytes()).digest())
    assert len(digests) == 1


def test_checkpointer_uses_state_dict_and_skips_non_tensor_states(tmp_path) -> None:
    ck = Checkpointer(tmp_path)
    model = nn.Linear(2, 1)
    ck.on_round_end(0, model, {})
    ck.on_round_end(1, "not a state", {})
    ck.on_round_end(2, {"note": "no tensors"}, {})
    assert [p.name for p in ck.saved] == ["round_000.safetensors"]
    assert torch.equal(load_file(str(ck.saved[0]))["weight"], model.weight.detach())
    with pytest.raises(ConfigError, match="every must be >= 1"):
        Checkpointer(tmp_path, every=0)
