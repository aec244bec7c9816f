"""What :func:`osfl.fl.tensor_fit.fit` computes, step by step: the same
numbers as a hand-written loop of its recipe (batch order, dropout seed,
clipping, schedule length, the epoch's mean loss), its mixed precision, its
progress bar and its refusals (mutants of ``osfl.fl.tensor_fit``: TESTING.md)."""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.optim import build_optimizer, build_schedule
from osfl.fl.tensor_fit import FitConfig, _forked_devices, fit
from support.progress import RecordingBoard
from support.simulated_device import count_syncs, simulated_device

#: a recipe that uses every part of the loop: a schedule over all steps,
#: clipping that binds, decoupled decay, a short last batch (20 = 2·8 + 4)
RECIPE = FitConfig(
    optimizer="adamw",
    lr=0.05,
    weight_decay=0.1,
    schedule="cosine",
    grad_clip=0.05,
    epochs=3,
    batch_size=8,
)


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, 4, generator=g)
    return x, torch.randint(0, 3, (20,), generator=g)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _by_hand(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: FitConfig) -> list[float]:
    """fit's recipe written out: one seed drawn from the generator for the
    dropout masks, a fresh permutation per epoch, the schedule over
    epochs · ⌈n / batch⌉ steps, clipping per step, each epoch's loss the
    sample-weighted mean of its batches'."""
    gen = torch.Generator().manual_seed(7)
    n = len(x)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(params, cfg)
    sched = build_schedule(opt, cfg, cfg.epochs * math.ceil(n / cfg.batch_size))
    model.train()
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    losses = []
    for _ in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        total = torch.zeros(())
        for i in range(0, n, cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            loss = _loss(model, x[idx], y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            total += loss.detach() * len(idx)
        losses.append(float(total) / n)
    return losses


def test_fit_computes_its_recipe_exactly() -> None:
    x, y = _data()
    model, reference = _model(), _model()
    outside = torch.get_rng_state()
    losses = fit(model, [x, y], _loss, RECIPE, generator=torch.Generator().manual_seed(7))
    # the dropout seed is drawn inside a fork: the caller's global RNG is untouched
    assert torch.equal(torch.get_rng_state(), outside)
    want = _by_hand(reference, x, y, RECIPE)
    assert losses == want
    for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert not model.training  # left in eval mode


def test_each_part_of_the_recipe_changes_the_result() -> None:
    """The hand-written loop is not blind to the parts the test above pins:
    without clipping, with a schedule of another length, the numbers move."""
    x, y = _data()
    base = _by_hand(_model(), x, y, RECIPE)
    assert _by_hand(_model(), x, y, dataclasses.replace(RECIPE, grad_clip=1e3)) != base
    assert _by_hand(_model(), x, y, dataclasses.replace(RECIPE, epochs=4))[:3] != base


def test_amp_autocasts_each_forward_pass_in_bfloat16() -> None:
    """``amp`` runs the loss under CPU autocast in bfloat16; off, in float32."""
    seen: list[tuple[bool, torch.dtype]] = []

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = model(x)
        seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        return out.float().pow(2).mean()

    x = torch.randn(6, 4)
    for amp in (True, False):
        seen.clear()
        cfg = FitConfig(epochs=2, batch_size=4, amp=amp)
        fit(nn.Linear(4, 2), [x], loss, cfg, generator=torch.Generator().manual_seed(0))
        want = (True, torch.bfloat16) if amp else (False, torch.float32)
        assert seen == [want] * 4  # 2 epochs of 2 batches


def test_progress_has_one_bar_of_one_step_per_epoch() -> None:
    board = RecordingBoard()
    fit(
        nn.Linear(2, 1),
        [torch.randn(5, 2)],
        lambda m, a: m(a).pow(2).mean(),
        FitConfig(epochs=4, batch_size=2),
        generator=torch.Generator(),
        progress=board,
        description="head",
    )
    assert [(b.name, b.total, sum(b.advances)) for b in board.bars] == [("head", 4, 4)]


def test_refusals_name_the_run_and_the_bad_value() -> None:
    gen = torch.Generator()
    with pytest.raises(ConfigError, match=r"^training: nothing to train on \(0 samples\)$"):
        fit(nn.Linear(1, 1), [torch.zeros(0, 1)], _loss, FitConfig(), generator=gen)
    with pytest.raises(ConfigError, match=r"^head: tensors of different lengths \[3, 2\]$"):
        fit(
            nn.Linear(1, 1),
            [torch.zeros(3, 1), torch.zeros(2)],
            _loss,
            FitConfig(),
            generator=gen,
            description="head",
        )
    # one sample and one epoch of one-sample batches is the least fit trains on
    one = FitConfig(epochs=1, batch_size=1)
    assert (
        len(fit(nn.Linear(1, 1), [torch.ones(1, 1)], lambda m, a: m(a).sum(), one, generator=gen))
        == 1
    )
    with pytest.raises(ConfigError, match=r"^epochs must be >= 1, got 0$"):
        FitConfig(epochs=0)
    with pytest.raises(ConfigError, match=r"^batch_size must be >= 1, got 0$"):
        FitConfig(batch_size=0)
    with pytest.raises(ConfigError, match=r"^keep must be one of last, lowest_loss; got 'best'$"):
        FitConfig(keep="best")
    assert FitConfig(keep="lowest_loss").keep == "lowest_loss"
    # the frozen-encoder papers' defaults: Adam at 5e-4, 60 epochs of 256, the last weights
    d = FitConfig()
    assert (d.optimizer, d.lr, d.epochs, d.batch_size, d.keep, d.amp) == (
        "adam",
        5e-4,
        60,
        256,
        "last",
        False,
    )


def test_amp_asks_for_bfloat16_on_every_device(monkeypatch) -> None:
    """bfloat16 by name: the CPU's autocast defaults to it, a GPU's to
    float16, which would need loss scaling."""
    asked: list[tuple[str, object]] = []

    def recording(device_type: str, dtype: object = None, **kw: object) -> nullcontext:
        asked.append((device_type, dtype))
        return nullcontext()

    monkeypatch.setattr(torch, "autocast", recording)
    fit(
        nn.Linear(4, 2),
        [torch.randn(3, 4)],
        lambda m, x: m(x).pow(2).mean(),
        FitConfig(epochs=1, batch_size=4, amp=True),
        generator=torch.Generator(),
    )
    assert asked == [("cpu", torch.bfloat16)]


@pytest.mark.parametrize(("kind", "forked"), [("cpu", False), ("cuda", True)])
def test_the_dropout_seed_forks_a_gpus_random_state_too(kind: str, forked: bool) -> None:
    device = torch.device(kind)
    assert _forked_devices(device) == ([device] if forked else [])


class _SometimesUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))
        self.calls = 0


def test_a_parameter_without_a_gradient_this_batch_is_not_stepped() -> None:
    """Gradients are set to ``None`` before each backward: Adam skips a
    parameter the loss did not reach this batch (zeroed gradients would let
    its moments carry it on). ``b`` is reached by the first batch only, where
    Adam's first step moves it by exactly the lr."""
    model = _SometimesUsed()

    def loss(m: _SometimesUsed, x: torch.Tensor) -> torch.Tensor:
        m.calls += 1
        return m.a.sum() * x.sum() + (m.b.sum() if m.calls == 1 else 0.0)

    fit(
        model,
        [torch.ones(3, 1)],
        loss,
        FitConfig(epochs=3, batch_size=3, lr=0.1),
        generator=torch.Generator(),
    )
    assert model.calls == 3 and model.b.item() == pytest.approx(0.9)
    assert model.a.item() < 0.8  # reached by every batch: moved three times


def test_on_a_device_fit_trains_there_and_reads_it_once_per_epoch() -> None:
    """The simulated GPU (tests/support/simulated_device.py): the tensors and
    the model go to the device once, every batch is indexed there and the
    epoch's loss is summed there; each epoch reads it once."""
    with simulated_device() as dev, count_syncs() as log:
        model = nn.Linear(4, 2)
        x, y = torch.randn(10, 4), torch.arange(10) % 2
        fit(
            model,
            [x, y],
            _loss,
            FitConfig(epochs=3, batch_size=4),
            generator=torch.Generator(),
            device=dev,
        )
        assert all(p.device == dev for p in model.parameters())
    reads = [e for e in log.events if e.kind == "read"]
    assert len(reads) == 3 and not [e for e in log.events if "index" in e.op]
