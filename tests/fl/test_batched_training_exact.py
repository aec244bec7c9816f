"""What the batched clients' step computes, part by part (mutants of
``osfl.fl.batched_training``: TESTING.md): gradient clipping per client is
``clip_grad_norm_`` on that client's own gradients, each client's norm
measured over all of its parameters, and a client under the limit untouched;
a client's batch stream is its own loader's epochs, cut at its step count;
a client's augmentations come from its own generator; a schedule steps with
the clients; what cannot train batched is refused by name; each client's
statistics count its own epochs and time."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import time

import pytest
import torch

from osfl.data.imageset import ImageSet
from osfl.data.loader import client_loader
from osfl.data.transforms import build_transform
from osfl.errors import ConfigError
from osfl.fl.batched_training import (
    _client_batches,
    _client_streams,
    _clip_per_client,
    batchable,
    train_batched,
)
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.models import create_model


def _stacked_grads(norms: list[float]) -> list[torch.Tensor]:
    """Two stacked parameters (a weight and a bias) of ``len(norms)``
    clients, client i's gradient of total norm ``norms[i]``, a third
    parameter without a gradient (frozen)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(len(norms), 4, 5, generator=g, dtype=torch.float64)
    b = torch.randn(len(norms), 5, generator=g, dtype=torch.float64)
    total = (w.flatten(1).pow(2).sum(1) + b.pow(2).sum(1)).sqrt()
    k = torch.tensor(norms, dtype=torch.float64) / total
    params = [torch.zeros_like(w, requires_grad=True), torch.zeros_like(b, requires_grad=True)]
    params[0].grad = w * k.view(-1, 1, 1)
    params[1].grad = b * k.view(-1, 1)
    return [*params, torch.zeros(len(norms), 3, requires_grad=True)]


def test_clipping_is_clip_grad_norm_per_client() -> None:
    """Client 0 is under the limit (left as it is), client 1 just over it
    (where clip_grad_norm_'s 1e-6 in the denominator shows: 1e-6 / 2e-4), client
    2 far over; each equals clip_grad_norm_ run on that client alone."""
    max_norm, norms = 1e-4, [5e-5, 2e-4, 3.0]
    params = _stacked_grads(norms)
    before = [p.grad.clone() for p in params[:2]]
    _clip_per_client(params, max_norm)
    assert params[2].grad is None
    for i in range(len(norms)):
        alone = [torch.nn.Parameter(p[i].detach().clone()) for p in before]
        for a, g in zip(alone, before, strict=True):
            a.grad = g[i].clone()
        torch.nn.utils.clip_grad_norm_(alone, max_norm)
        for a, p in zip(alone, params[:2], strict=True):
            torch.testing.assert_close(p.grad[i], a.grad, rtol=1e-12, atol=0.0)
    # under the limit: the very same numbers; over it: norm max_norm / (norm + 1e-6) · norm
    assert torch.equal(params[0].grad[0], before[0][0])
    got = torch.cat([params[0].grad[1].flatten(), params[1].grad[1]]).norm()
    assert float(got) == pytest.approx(max_norm * 2e-4 / (2e-4 + 1e-6), rel=1e-12)


def test_no_gradient_at_all_is_left_alone() -> None:
    frozen = [torch.zeros(2, 3, requires_grad=True)]
    _clip_per_client(frozen, 1.0)
    assert frozen[0].grad is None


@pytest.mark.parametrize(("drop_last", "sizes"), [(False, [8, 8, 4, 8, 8]), (True, [8] * 5)])
def test_a_client_stream_is_its_loaders_epochs_cut_at_its_step_count(
    drop_last: bool, sizes: list[int]
) -> None:
    """``_client_batches`` yields exactly ``total`` batches (no more, however
    far it is pulled), epoch after epoch of the client's own loader with its
    ``drop_last``: the same tensors, in the same order, as iterating
    :func:`client_loader` on a generator of the same seed."""
    g = torch.Generator().manual_seed(0)
    data = ImageSet(
        torch.randint(0, 256, (20, 3, 4, 4), dtype=torch.uint8, generator=g),
        torch.arange(20) % 3,
        classes=["a", "b", "c"],
    )
    cfg = TrainConfig(epochs=1, batch_size=8, drop_last=drop_last)
    cpu = torch.device("cpu")
    stream = _client_batches(data, cfg, torch.Generator().manual_seed(4), cpu, 5)
    got = list(itertools.islice(stream, 9))
    assert [len(y) for _, y in got] == sizes
    loader = client_loader(data, 8, drop_last, torch.Generator().manual_seed(4), cpu)
    want = [b for _ in range(3) for b in loader][:5]
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    assert list(_client_batches(data, cfg, torch.Generator(), cpu, 0)) == []


def test_each_client_augments_with_its_own_generator() -> None:
    """With a random augmentation (crop and flip) every client's batches are
    augmented from its own generator, interleaved with its loader's draws as
    in its sequential run: the same weights as ``train_local`` per client.
    Clients augmenting from another stream (the global RNG, a shared
    generator) end elsewhere."""
    tf = build_transform("crop_flip", image_size=8, mean=[0.5] * 3, std=[0.25] * 3)
    g = torch.Generator().manual_seed(1)
    datas = [
        ImageSet(
            torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g),
            torch.randint(0, 4, (n,), generator=g),
            classes=["0", "1", "2", "3"],
        )
        for n in (12, 20)
    ]
    cfg = TrainConfig(optimizer="sgd", lr=0.1, epochs=2, batch_size=8)
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=4, in_chans=3, img_size=8, width=8)
    init = copy.deepcopy(model.state_dict())
    torch.manual_seed(123)  # a global stream that no client may draw from
    batched = train_batched(
        model, datas, cfg, [torch.Generator().manual_seed(10 + i) for i in range(2)], transform=tf
    )
    for i, data in enumerate(datas):
        alone = copy.deepcopy(model)
        alone.load_state_dict(init)
        torch.manual_seed(456)
        train_local(alone, data, cfg, transform=tf, generator=torch.Generator().manual_seed(10 + i))
        for k, v in alone.state_dict().items():
            if v.is_floating_point():
                torch.testing.assert_close(batched[i].state[k], v, atol=1e-5, rtol=1e-5, msg=k)
            else:
                assert torch.equal(batched[i].state[k], v), k


def test_why_not_batched_names_the_module_and_the_reason() -> None:
    """Dropout with p > 0 is refused by its module's name (``model`` for the
    root module), dropout with p = 0 draws no mask and is not; a schedule that
    is not constant needs one step count; every client needs a generator."""
    cfg = TrainConfig(epochs=1, batch_size=8)
    named = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.25))
    assert batchable(named, cfg, [10, 10]) == (
        "1 has dropout (p=0.25): its masks would differ per run"
    )
    assert batchable(torch.nn.Dropout(0.5), cfg, [10, 10]) == (
        "model has dropout (p=0.5): its masks would differ per run"
    )
    off = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0))
    assert batchable(off, cfg, [10, 10]) is None
    cosine = TrainConfig(epochs=1, batch_size=8, schedule="cosine")
    assert batchable(torch.nn.Linear(2, 2), cosine, [10, 30]) == (
        "the lr schedule is not constant and the clients take different numbers of steps"
    )
    g = torch.Generator().manual_seed(0)
    two = [
        ImageSet(
            torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4) % 2, classes=["a", "b"]
        )
        for _ in range(2)
    ]
    with pytest.raises(ConfigError, match=r"^2 data sets but 1 generators$"):
        train_batched(
            torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)), two, cfg, [g]
        )


def test_a_schedule_steps_with_the_clients() -> None:
    """A cosine schedule over the clients' common step count: each client's
    learning rate falls as in its own run, so the weights equal ``train_local``'s."""
    cfg = TrainConfig(optimizer="sgdm", lr=0.2, epochs=3, batch_size=8, schedule="cosine")
    g = torch.Generator().manual_seed(2)
    datas = [
        ImageSet(
            torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=g),
            torch.randint(0, 4, (16,), generator=g),
            classes=["0", "1", "2", "3"],
        )
        for _ in range(2)
    ]
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=4, in_chans=3, img_size=8, width=8)
    init = copy.deepcopy(model.state_dict())
    batched = train_batched(model, datas, cfg, [torch.Generator().manual_seed(i) for i in (1, 2)])
    for i, data in enumerate(datas):
        alone = copy.deepcopy(model)
        alone.load_state_dict(init)
        train_local(alone, data, cfg, generator=torch.Generator().manual_seed(i + 1))
        for k, v in alone.state_dict().items():
            if v.is_floating_point():
                torch.testing.assert_close(batched[i].state[k], v, atol=1e-5, rtol=1e-5, msg=k)
    # the schedule matters here: at a constant rate the clients end elsewhere
    flat = train_batched(
        model,
        datas,
        dataclasses.replace(cfg, schedule="constant"),
        [torch.Generator().manual_seed(i) for i in (1, 2)],
    )
    assert not torch.allclose(flat[0].state["fc.weight"], batched[0].state["fc.weight"])


def test_each_client_reports_its_own_epochs_and_time() -> None:
    """A client of one batch per epoch trained 3 epochs reports 3 epochs, as
    one of three batches per epoch does; each reports the seconds from the
    start of training to its last step (within the call's own duration)."""
    g = torch.Generator().manual_seed(3)
    datas = [
        ImageSet(
            torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g),
            torch.randint(0, 4, (n,), generator=g),
            classes=["0", "1", "2", "3"],
        )
        for n in (5, 20)
    ]
    cfg = TrainConfig(optimizer="sgd", lr=0.1, epochs=3, batch_size=8)
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=4, in_chans=3, img_size=8, width=8)
    before = time.perf_counter()
    out = train_batched(model, datas, cfg, [torch.Generator().manual_seed(i) for i in (1, 2)])
    took = time.perf_counter() - before
    assert [r.stats.steps for r in out] == [3, 9]
    assert [r.stats.epochs for r in out] == [3.0, 3.0]
    assert all(0.0 < r.stats.seconds <= took for r in out)
    assert out[0].stats.seconds <= out[1].stats.seconds  # client 0 finished first


def test_each_clients_tally_keeps_its_sums_on_the_training_device() -> None:
    """A client's statistics are summed where it trains (read once at the end,
    not copied to the host each step): on the "meta" device here, which no
    CPU sum can be added to; its epoch is its own batches per epoch, at most
    its step count."""
    sets = [
        ImageSet(
            torch.zeros(n, 3, 2, 2, dtype=torch.uint8), torch.arange(n) % 2, classes=["a", "b"]
        )
        for n in (4, 10)
    ]
    meta = torch.device("meta")
    cfg = TrainConfig(epochs=1, batch_size=4)
    _, tallies = _client_streams(sets, [torch.Generator(), torch.Generator()], cfg, meta, [1, 6])
    for t in tallies:
        assert {s.device for s in (t.loss_sum, t.first, t.final, t.correct)} == {meta}
    assert [(t.total, t.per_epoch) for t in tallies] == [(1, 1), (6, 3)]
