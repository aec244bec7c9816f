"""Client-training cache: keys, storage, atomicity and cached client training
(osfl.fl.cache)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
import torch
from torch import nn

import osfl.fl.client_training as cache_mod
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.cache import ClientCache, state_hash, transform_key
from osfl.fl.client_training import train_client
from osfl.fl.context import ClientContext, ModelSpec, RunContext
from osfl.fl.objectives import ProximalTerm
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import init_model


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.fc = nn.Linear(16, num_classes)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class TinySpec(ModelSpec):
    """A ModelSpec that builds the test model without the model registry."""

    def build(self, num_classes: int) -> nn.Module:
        return TinyNet(num_classes)


class Shift:
    """A deterministic transform with a parameter (its repr is its cache identity)."""

    def __init__(self, by: float):
        self.by = by

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return x.float() / 255 + self.by

    def __repr__(self) -> str:
        return f"Shift(by={self.by})"


def make_data(n: int = 12, seed: int = 0) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 3, classes=("a", "b", "c"))


def make_run(cache: ClientCache | None, **kw: Any) -> RunContext:
    args: dict[str, Any] = {
        "num_classes": 3,
        "image_shape": (1, 4, 4),
        "num_clients": 2,
        "model": TinySpec("tiny"),
        "train": TrainConfig(epochs=1, batch_size=4, lr=0.1),
        "train_transform": Shift(0.0),
        "eval_transform": Shift(0.0),
        "seed": 0,
        "cache": cache,
    }
    args.update(kw)
    return RunContext(**args)


def ctx_of(run: RunContext, client: int = 0, round: int = 0) -> ClientContext:
    return ClientContext(run=run, client_id=client, round=round, generator=torch.Generator())


@pytest.fixture
def count_training(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of train_local made through train_client."""
    calls: list[int] = []
    real = cache_mod.train_local

    def counting(*args: Any, **kwargs: Any):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache_mod, "train_local", counting)
    return calls


# --- keys and storage -------------------------------------------------------------------


def test_key_is_canonical() -> None:
    a = ClientCache.key(data="abc", seed=1, train={"lr": 0.1, "epochs": 2})
    b = ClientCache.key(train={"epochs": 2, "lr": 0.1}, seed=1, data="abc")
    assert a == b and len(a) == 64
    assert ClientCache.key(data="abc", seed=2, train={"lr": 0.1, "epochs": 2}) != a
    assert ClientCache.key(data="abc", seed=1, train={"lr": 0.2, "epochs": 2}) != a


def test_key_refuses_non_json_parts() -> None:
    with pytest.raises(ConfigError, match="JSON"):
        ClientCache.key(model=object())
    with pytest.raises(ConfigError, match="JSON"):
        ClientCache.key(lr=float("nan"))


def test_put_get_roundtrip(tmp_path) -> None:
    cache = ClientCache(tmp_path / "c")
    state = {
        "w": torch.randn(3, 4),
        "n": torch.tensor(7, dtype=torch.int64),
        "h": torch.randn(2).to(torch.bfloat16),
    }
    state["tied"] = state["w"]  # shared storage must not trip safetensors
    key = cache.key(x=1)
    assert cache.get(key) is None and cache.misses == 1
    cache.put(key, state, {"parts": {"x": 1}})
    got = cache.get(key)
    assert got is not None and cache.hits == 1
    assert set(got) == set(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v)
    meta = cache.meta(key)
    assert meta["parts"] == {"x": 1} and len(meta["sha256"]["weights"]) == 64
    assert json.loads((tmp_path / "c" / f"{key}.json").read_text())["parts"] == {"x": 1}
    assert len(cache) == 1
    assert not list((tmp_path / "c").glob("*.tmp"))  # atomic writes leave no temporaries


def test_get_or_train_trains_once(tmp_path) -> None:
    cache = ClientCache(tmp_path)
    calls: list[int] = []

    def train() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"w": torch.arange(4.0)}

    a, hit_a = cache.get_or_train({"client": 0}, train)
    b, hit_b = cache.get_or_train({"client": 0}, train)
    _, hit_c = cache.get_or_train({"client": 1}, train)
    assert (hit_a, hit_b, hit_c) == (False, True, False)
    assert len(calls) == 2 and torch.equal(a["w"], b["w"])
    assert (cache.hits, cache.misses) == (1, 2)
    # a new cache object on the same root sees the entries (persistence)
    assert ClientCache(tmp_path).get_or_train({"client": 0}, train)[1] is True


def test_corrupt_entry_is_a_miss(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    cache = ClientCache(tmp_path)
    key = cache.key(x=1)
    (tmp_path / f"{key}.safetensors").write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING):
        assert cache.get(key) is None
    assert "unusable" in caplog.text


def test_weights_changed_after_writing_are_a_warned_miss(tmp_path, caplog) -> None:
    """Negated weights still parse: only the sidecar's sha256 tells them apart."""
    from safetensors.torch import save_file

    cache = ClientCache(tmp_path)
    key = cache.key(x=1)
    cache.put(key, {"w": torch.ones(3)}, {"parts": {"x": 1}}, aux={"a": torch.arange(2)})
    save_file({"w": -torch.ones(3)}, str(tmp_path / f"{key}.safetensors"))
    with caplog.at_level(logging.WARNING):
        assert cache.get(key) is None
    assert "sha256 mismatch" in caplog.text and cache.misses == 1
    save_file({"a": torch.zeros(2, dtype=torch.int64)}, str(tmp_path / f"{key}.aux.safetensors"))
    assert cache.aux(key) is None
    (tmp_path / f"{key}.json").write_text("{not json")  # a damaged sidecar: a miss too
    cache.put(cache.key(x=2), {"w": torch.ones(3)})
    assert cache.get(key) is None and cache.get(cache.key(x=2)) is not None


def test_an_entry_that_does_not_fit_the_model_is_a_miss(tmp_path, caplog) -> None:
    cache = ClientCache(tmp_path)
    key = cache.key(x=1)
    cache.put(key, {"w": torch.ones(3)})
    with caplog.at_level(logging.WARNING):
        assert cache.get(key, like={"v": torch.ones(3)}) is None
        assert cache.get(key, like={"w": torch.ones(4)}) is None
        assert cache.get(key, like={"w": torch.ones(3, dtype=torch.float64)}) is None
    assert caplog.text.count("does not fit the model") == 3
    assert cache.get(key, like={"w": torch.zeros(3)}) is not None


def test_train_client_retrains_over_a_tampered_entry(tmp_path, count_training) -> None:
    from safetensors.torch import load_file, save_file

    run = make_run(ClientCache(tmp_path))
    data = make_data()
    good = weights(train_client(ctx_of(run), data))
    (key,) = _keys(tmp_path)
    path = tmp_path / f"{key}.safetensors"
    save_file({k: -v for k, v in load_file(str(path)).items()}, str(path))
    again = weights(train_client(ctx_of(run), data))
    assert len(count_training) == 2  # retrained, not the negated weights
    assert all(torch.equal(again[k], v) for k, v in good.items())
    assert ClientCache(tmp_path).get(key) is not None  # and the entry was overwritten


def test_clear_removes_only_cache_files(tmp_path) -> None:
    cache = ClientCache(tmp_path)
    for i in range(3):
        cache.put(cache.key(i=i), {"w": torch.zeros(1)})
    (tmp_path / "notes.json").write_text("{}")
    assert cache.clear() == 3
    assert len(cache) == 0 and [p.name for p in tmp_path.iterdir()] == ["notes.json"]


def test_bad_key_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not a cache key"):
        ClientCache(tmp_path).get("../../etc/passwd")


def test_state_hash() -> None:
    a = {"w": torch.ones(2), "b": torch.zeros(1, dtype=torch.bfloat16)}
    assert state_hash(a) == state_hash({"b": a["b"].clone(), "w": a["w"].clone()})
    assert state_hash(a) != state_hash({**a, "w": torch.tensor([1.0, 1.5])})
    assert state_hash(a) != state_hash({**a, "w": torch.ones(2, dtype=torch.float64)})


def test_transform_key_ignores_addresses() -> None:
    class NoRepr:
        pass

    assert transform_key(None) is None
    assert transform_key(Shift(0.5)) == transform_key(Shift(0.5)) != transform_key(Shift(0.25))
    assert transform_key(NoRepr()) == transform_key(NoRepr())


# --- train_client ------------------------------------------------------------------------


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_train_client_reuses_the_cache(tmp_path, count_training: list[int]) -> None:
    run = make_run(ClientCache(tmp_path))
    data = make_data()
    first = weights(train_client(ctx_of(run), data))
    second_model = train_client(ctx_of(run), data)
    assert len(count_training) == 1
    assert not second_model.training
    for k, v in weights(second_model).items():
        assert torch.equal(v, first[k])
    # the round is not part of the key: one-shot methods share the entry
    train_client(ctx_of(run, round=3), data)
    assert len(count_training) == 1
    (key,) = _keys(tmp_path)
    meta = ClientCache(tmp_path).meta(key)
    assert meta["stats"]["steps"] == 3 and meta["parts"]["client"] == 0
    assert ClientCache.key(**meta["parts"]) == key  # the sidecar documents the key exactly


def _keys(root) -> list[str]:
    return [p.stem for p in root.glob("*.safetensors") if "." not in p.stem]


def test_trained_weights_differ_from_init(tmp_path) -> None:
    run = make_run(ClientCache(tmp_path))
    init = weights(init_model(run))
    trained = weights(train_client(ctx_of(run), make_data()))
    assert not torch.equal(init["fc.weight"], trained["fc.weight"])


def _with(run: RunContext, **changes: Any) -> ClientContext:
    return ctx_of(dataclasses.replace(run, **changes))


# each entry: run -> (client context, data, train_client keyword arguments)
CHANGES = {
    "data": lambda run: (ctx_of(run), make_data(seed=1), {}),
    "train config": lambda run: (
        _with(run, train=TrainConfig(batch_size=4, lr=0.2)),
        make_data(),
        {},
    ),
    "cfg override": lambda run: (ctx_of(run), make_data(), {"cfg": TrainConfig(lr=0.3)}),
    "run seed": lambda run: (_with(run, seed=1), make_data(), {}),
    "client id": lambda run: (ctx_of(run, client=1), make_data(), {}),
    "model spec": lambda run: (_with(run, model=TinySpec("tiny", {"width": 2})), make_data(), {}),
    "transform": lambda run: (ctx_of(run), make_data(), {"transform": Shift(0.5)}),
    "objective": lambda run: (ctx_of(run), make_data(), {"objective": "supcon"}),
    "extra key": lambda run: (ctx_of(run), make_data(), {"extra_key": {"v": 2}}),
    "terms": lambda run: (ctx_of(run), make_data(), {"terms": [ProximalTerm(TinyNet(), mu=0.1)]}),
    "initial weights": lambda run: (ctx_of(run), make_data(), {"model": TinyNet()}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_changing_any_part_misses(tmp_path, count_training: list[int], change: str) -> None:
    run = make_run(ClientCache(tmp_path))
    train_client(ctx_of(run), make_data())
    assert len(count_training) == 1
    ctx, data, kwargs = CHANGES[change](run)
    train_client(ctx, data, **kwargs)
    assert len(count_training) == 2, change
    train_client(ctx, data, **kwargs)  # ... and the changed parts hit the second time
    expected = 3 if change == "initial weights" else 2  # a fresh TinyNet() is not reused
    assert len(count_training) == expected


def test_weights_trained_under_other_threads_are_a_miss(tmp_path, count_training) -> None:
    """A thread count changes CPU reductions in the last bits: an entry made
    with 1 torch thread is not what a 2-thread run trains, so it is a miss,
    and each entry's sidecar states the environment it was trained in."""
    run = make_run(ClientCache(tmp_path))
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            train_client(ctx_of(run), make_data())
    finally:
        torch.set_num_threads(before)
    assert len(count_training) == 2  # 1 thread, 2 threads; then 1 thread hits
    envs = sorted(
        ClientCache(tmp_path).meta(k)["parts"]["environment"]["threads"] for k in _keys(tmp_path)
    )
    assert envs == [1, 2]
    env = ClientCache(tmp_path).meta(_keys(tmp_path)[0])["parts"]["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["cpu_capability"]


def test_given_model_with_same_init_hits(tmp_path, count_training: list[int]) -> None:
    run = make_run(ClientCache(tmp_path))
    torch.manual_seed(5)
    init = TinyNet().state_dict()

    def model() -> nn.Module:
        m = TinyNet()
        m.load_state_dict(init)
        return m

    a = weights(train_client(ctx_of(run), make_data(), model=model()))
    b = weights(train_client(ctx_of(run), make_data(), model=model()))
    assert len(count_training) == 1 and all(torch.equal(a[k], b[k]) for k in a)


def test_without_cache_or_with_on_batch_trains_every_time(tmp_path, count_training) -> None:
    run = make_run(None)
    a = weights(train_client(ctx_of(run), make_data()))
    b = weights(train_client(ctx_of(run), make_data()))
    assert len(count_training) == 2 and all(torch.equal(a[k], b[k]) for k in a)  # deterministic
    cached = make_run(ClientCache(tmp_path))
    labels: list[torch.Tensor] = []
    for _ in range(2):
        train_client(ctx_of(cached), make_data(), on_batch=lambda s, x, y: labels.append(y))
    assert len(count_training) == 4 and len(labels) == 6
    assert len(ClientCache(tmp_path)) == 0


def test_init_model_is_common_and_leaves_global_rng(tmp_path) -> None:
    run = make_run(None)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b = init_model(run), init_model(run)
    assert torch.equal(torch.rand(1), expected_next)
    assert torch.equal(a.fc.weight, b.fc.weight)
    other = init_model(dataclasses.replace(run, seed=1))
    assert not torch.equal(a.fc.weight, other.fc.weight)


def test_train_client_with_a_registered_model(tmp_path, count_training: list[int]) -> None:
    run = make_run(ClientCache(tmp_path), model=ModelSpec("cnn_small", {"in_chans": 1}))
    a = weights(train_client(ctx_of(run), make_data()))
    b = weights(train_client(ctx_of(run, round=1), make_data()))
    assert len(count_training) == 1 and all(torch.equal(a[k], b[k]) for k in a)
    assert a["features.bn1.num_batches_tracked"].item() == 3  # BN buffers are cached too


def test_cache_hit_replays_the_step_labels(tmp_path, count_training: list[int]) -> None:
    from osfl.fl.training import record_step_labels

    run = make_run(ClientCache(tmp_path))
    with record_step_labels() as trained:
        train_client(ctx_of(run), make_data())
    with record_step_labels() as replayed:
        train_client(ctx_of(run), make_data())
    assert len(count_training) == 1
    assert [len(y) for y in trained] == [4, 4, 4]
    assert len(replayed) == 3 and all(
        torch.equal(a, b) for a, b in zip(trained, replayed, strict=True)
    )
    train_client(ctx_of(run), make_data())  # no active recorder: nothing to replay, no error
    (key,) = _keys(tmp_path)
    assert (tmp_path / f"{key}.aux.safetensors").exists()
    assert ClientCache(tmp_path).clear() == 1 and not list(tmp_path.iterdir())
