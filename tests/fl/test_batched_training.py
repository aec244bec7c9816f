"""Batched clients (osfl.fl.batched_training): the same clients as sequential
training, up to float tolerance, and the cache hand-off to each client's turn."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.batched_training import batchable, train_batched
from osfl.fl.method import METHODS
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import record_step_labels, train_local
from osfl.methods.ensemble import EnsembleConfig
from osfl.methods.fedavg import FedAvg, FedAvgConfig
from osfl.models import create_model
from support.simulate import simulate, state_of


def _client_sets(sizes: list[int], classes: int = 4, px: int = 8) -> list[ImageSet]:
    g = torch.Generator().manual_seed(1)
    return [
        ImageSet(
            torch.randint(0, 256, (n, 3, px, px), dtype=torch.uint8, generator=g),
            torch.randint(0, classes, (n,), generator=g),
            classes=[str(c) for c in range(classes)],
        )
        for n in sizes
    ]


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k  # e.g. BatchNorm's num_batches_tracked


@pytest.mark.parametrize(
    "cfg",
    [
        # uneven clients: short last batches at different steps, ragged step counts
        TrainConfig(optimizer="sgdm", lr=0.05, epochs=2, batch_size=16, grad_clip=1.0),
        TrainConfig(optimizer="adam", lr=1e-3, steps=7, batch_size=16, weight_decay=1e-4),
    ],
)
def test_batched_clients_equal_sequential_training(cfg: TrainConfig):
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=4, in_chans=3, img_size=8, width=8)
    datas = _client_sets([23, 40, 57])
    init = copy.deepcopy(model.state_dict())
    batched = train_batched(
        model, datas, cfg, [torch.Generator().manual_seed(10 + i) for i in range(3)]
    )
    _close(model.state_dict(), init, 0.0)  # the template is not trained
    for i, data in enumerate(datas):
        alone = copy.deepcopy(model)
        alone.load_state_dict(init)
        with record_step_labels() as labels:
            stats = train_local(alone, data, cfg, generator=torch.Generator().manual_seed(10 + i))
        _close(batched[i].state, state_of(alone), 1e-4)
        assert batched[i].stats.steps == stats.steps == cfg.total_steps(len(data))
        assert batched[i].stats.samples == stats.samples
        assert batched[i].stats.mean_loss == pytest.approx(stats.mean_loss, rel=1e-4)
        assert batched[i].stats.train_accuracy == stats.train_accuracy
        # one StepTally keeps both loops' statistics: the same fields, the same meaning
        assert batched[i].stats.epochs == stats.epochs
        assert batched[i].stats.num_classes == stats.num_classes
        assert batched[i].stats.first_loss == pytest.approx(stats.first_loss, rel=1e-4)
        assert batched[i].stats.final_loss == pytest.approx(stats.final_loss, rel=1e-4)
        assert len(batched[i].step_labels) == len(labels)
        assert all(torch.equal(a, b) for a, b in zip(batched[i].step_labels, labels, strict=True))


def test_batched_clients_differ_from_each_other():
    model = create_model("lenet5", num_classes=4, in_chans=3, img_size=16)
    out = train_batched(
        model,
        _client_sets([30, 30], px=16),
        TrainConfig(optimizer="sgdm", lr=0.05, epochs=1, batch_size=8),
        [torch.Generator().manual_seed(i) for i in range(2)],
    )
    assert not torch.equal(out[0].state["fc3.weight"], out[1].state["fc3.weight"])
    assert all(torch.isfinite(v).all() for r in out for v in r.state.values())


def test_what_cannot_train_batched_is_refused():
    cfg = TrainConfig(epochs=1, batch_size=8)
    dropout = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(192, 4))
    assert "dropout" in (batchable(dropout, cfg, [10, 10]) or "")
    assert batchable(nn.Linear(2, 2), cfg, [10]) == "fewer than two clients"
    cosine = TrainConfig(epochs=1, batch_size=8, schedule="cosine")
    assert "schedule" in (batchable(nn.Linear(2, 2), cosine, [10, 30]) or "")
    assert batchable(nn.Linear(2, 2), cosine, [10, 12]) is None  # same number of steps
    with pytest.raises(ConfigError, match="dropout"):
        train_batched(dropout, _client_sets([10, 10]), cfg, [torch.Generator()] * 2)


@pytest.mark.parametrize("method", ["fedavg", "ensemble"])
def test_batch_clients_fills_the_cache_each_turn_reads(make_ctx, monkeypatch, method: str):
    import osfl.fl.client_training as client_training

    solo_calls: list[Any] = []
    real = client_training.train_local

    def counting(*a: Any, **kw: Any) -> Any:
        solo_calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(client_training, "train_local", counting)
    config = FedAvgConfig() if method == "fedavg" else EnsembleConfig()
    cls = FedAvg if method == "fedavg" else METHODS.get("ensemble")
    ctx = make_ctx(4)
    batched = simulate(cls, config, ctx, batch_clients=True)
    assert solo_calls == []  # no client trained on its own
    assert ctx.run.cache.misses == 0 and ctx.run.cache.hits == 4  # every turn read its entry
    again = make_ctx(4)
    assert again.run.cache.clear() == 4  # same cache directory: empty it
    solo = simulate(cls, config, again)  # clients one by one
    assert len(solo_calls) == 4
    assert batched.bytes_up == solo.bytes_up
    x = torch.rand(6, 1, 8, 8)  # digits: one channel
    with torch.no_grad():
        torch.testing.assert_close(batched.predictor(x), solo.predictor(x), atol=1e-3, rtol=1e-3)


def test_multi_round_fedavg_is_not_batched(make_ctx, monkeypatch):
    import osfl.fl.client_training as client_training

    calls: list[Any] = []
    monkeypatch.setattr(client_training, "train_batched", lambda *a, **kw: calls.append(1))
    simulate(FedAvg, FedAvgConfig(rounds=2), make_ctx(3), batch_clients=True)
    assert calls == []
