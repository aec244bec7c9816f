"""The local training loop's wiring, checked where a CPU can: what a CUDA run
would take (autocast, loss scaling, ``torch.compile``, channels_last) decided
from a ``torch.device("cuda")`` object without running on it, the scaled step
against a plain one, the loss bar's three read paths, and what ``train_local``
hands to its hooks, its log and its record.

Written for the mutants of ``osfl.fl.training`` that the unit tests did not
see (TESTING.md, "The training modules"): each test states the behaviour the
module docstring promises, so a swapped condition or a dropped argument
changes an asserted value.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from contextlib import nullcontext
from typing import ClassVar

import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import emulate_device_path
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import (
    _batch_layout,
    _cuda_layout,
    _is_convnet,
    _LossBar,
    _Stepper,
    collect_training_warnings,
    init_model,
    report_training_warnings,
    train_local,
)
from support.progress import RecordedBar, RecordingBoard
from support.simulated_device import count_syncs, simulated_device

CUDA = torch.device("cuda")  # an object only: nothing here runs on a GPU


def _data(n: int = 12) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 3, classes=("a", "b", "c"))


def _linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 3))


# --------------------------------------------------------------------------- convnets
class _PatchOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 4, kernel_size=4, stride=4)


@pytest.mark.parametrize(
    ("model", "convolves"),
    [
        (nn.Conv2d(3, 4, 3), True),
        (nn.Sequential(_PatchOnly(), nn.Conv2d(4, 4, 3, stride=1)), True),
        (nn.Conv2d(3, 4, (3, 3), stride=(1, 1)), True),
        (_PatchOnly(), False),  # a ViT's patch embedding: kernel = stride
        (nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), False),
    ],
)
def test_a_convnet_is_a_conv_whose_kernel_is_not_its_stride(model: nn.Module, convolves: bool):
    assert _is_convnet(model) is convolves


def test_only_a_convnet_bound_for_cuda_trains_in_channels_last(monkeypatch) -> None:
    """Inside: NHWC weights and ``cudnn.benchmark``; after: the usual layout
    again (state dicts are saved from it). The CPU and a ViT keep theirs."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    conv = nn.Conv2d(3, 4, 3)
    with _cuda_layout(conv, torch.device("cpu")) as on:
        assert on is False and conv.weight.is_contiguous()
    with _cuda_layout(_PatchOnly(), CUDA) as on:
        assert on is False
    assert torch.backends.cudnn.benchmark is False
    with _cuda_layout(conv, CUDA) as on:
        assert on is True and torch.backends.cudnn.benchmark is True
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert not conv.weight.is_contiguous()
    assert conv.weight.is_contiguous()


def test_an_image_batch_follows_the_layout_and_tokens_pass() -> None:
    images = torch.randn(2, 3, 5, 5)
    nhwc = _batch_layout(images, True)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert torch.equal(nhwc, images)
    assert _batch_layout(images, False) is images
    tokens = torch.randn(2, 7, 5)
    assert _batch_layout(tokens, True) is tokens


# --------------------------------------------------------------------------- the stepper
class _Recorder(ObjectiveTerm):
    """A term that adds nothing and records what each hook is given."""

    def __init__(self):
        self.calls: list[tuple[str, object, object]] = []

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append(("setup", model, optimizer))

    def before_step(self, model: nn.Module) -> None:
        self.calls.append(("before", model, None))

    def after_step(self, model: nn.Module) -> None:
        self.calls.append(("after", model, None))


def _stepper(cfg: TrainConfig, device: torch.device, terms=(), model=None) -> _Stepper:
    return _Stepper(model or _linear(), cfg, 10, device, terms, None)


@pytest.fixture
def compiled(monkeypatch) -> list[nn.Module]:
    """``torch.compile`` replaced by a recorder: what it was given."""
    given: list[nn.Module] = []

    def fake(model: nn.Module) -> object:
        given.append(model)
        return ("compiled", model)

    monkeypatch.setattr(torch, "compile", fake)
    return given


@pytest.mark.parametrize("bf16", [True, False])
def test_on_cuda_the_stepper_autocasts_compiles_and_scales_fp16_only(
    monkeypatch, compiled, bf16: bool
) -> None:
    """``train.amp`` on CUDA: autocast to the GPU's dtype, a GradScaler
    (for CUDA) only for fp16; ``train.compile`` compiles the forward."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    model = _linear()
    with pytest.warns(UserWarning) if not bf16 else nullcontext():  # no CUDA to scale on
        stepper = _stepper(TrainConfig(compile=True), CUDA, model=model)
    assert compiled == [model] and stepper.forward_model == ("compiled", model)
    with pytest.warns(UserWarning):  # "CUDA is not available": entered nowhere
        cast = stepper.autocast()
    want = torch.bfloat16 if bf16 else torch.float16
    assert isinstance(cast, torch.autocast) and cast.device == "cuda" and cast.fast_dtype == want
    if bf16:
        assert stepper.scaler is None
    else:
        assert isinstance(stepper.scaler, torch.amp.GradScaler)
        assert stepper.scaler._device == "cuda"
    assert stepper.unscale is False  # no clipping and no term to show true gradients to


def test_off_cuda_or_without_amp_nothing_casts_compiles_or_scales(monkeypatch, compiled) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    for device, cfg in [
        (torch.device("cpu"), TrainConfig(compile=True, amp=True, grad_clip=1.0)),
        (CUDA, TrainConfig(compile=False, amp=False, grad_clip=1.0)),
    ]:
        model = _linear()
        stepper = _stepper(cfg, device, terms=(_Recorder(),), model=model)
        assert stepper.forward_model is model and stepper.scaler is None
        assert stepper.autocast is nullcontext and stepper.unscale is False
    assert compiled == []


@pytest.mark.parametrize(
    ("grad_clip", "with_term", "unscale"),
    [(None, False, False), (1.0, False, True), (None, True, True), (1.0, True, True)],
)
def test_fp16_gradients_are_unscaled_before_clipping_or_a_term_sees_them(
    monkeypatch, grad_clip: float | None, with_term: bool, unscale: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    terms = (_Recorder(),) if with_term else ()
    with pytest.warns(UserWarning):
        stepper = _stepper(TrainConfig(grad_clip=grad_clip), CUDA, terms=terms)
    assert stepper.unscale is unscale


def test_a_constant_lr_has_no_scheduler_and_a_schedule_spans_the_run() -> None:
    assert _stepper(TrainConfig(), torch.device("cpu")).schedule is None
    cosine = _stepper(TrainConfig(schedule="cosine"), torch.device("cpu")).schedule
    factor = cosine.lr_lambdas[0]  # over the 10 steps the stepper was built for
    assert [factor(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])


def test_a_scaled_step_equals_a_plain_one_and_every_hook_gets_its_objects() -> None:
    """With a GradScaler (torch's CPU one stands in for CUDA's), the loss is
    scaled for backward and the gradients unscaled before clipping: the step
    is the unscaled step. Clipping is tight, so gradients still scaled by
    2¹⁰ (or unscaled twice) would move the weights elsewhere."""
    x, y = torch.randn(6, 3, 4, 4, generator=torch.Generator().manual_seed(1)), torch.arange(6) % 3
    cfg = TrainConfig(lr=0.5, grad_clip=0.05)
    plain = _stepper(cfg, torch.device("cpu"), model=_linear())
    term = _Recorder()
    scaled = _stepper(cfg, torch.device("cpu"), terms=(term,), model=_linear())
    scaled.scaler, scaled.unscale = torch.amp.GradScaler("cpu", init_scale=2.0**10), True
    for stepper in (plain, scaled):
        stepper(x, y)
    for a, b in zip(plain.model.parameters(), scaled.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.equal(plain.model[1].weight, _linear()[1].weight)  # it moved
    assert scaled.scaler.get_scale() == 2.0**10  # updated, finite: kept
    assert term.calls == [
        ("setup", scaled.model, scaled.optimizer),
        ("before", scaled.model, None),
        ("after", scaled.model, None),
    ]


class _SometimesUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))
        self.calls = 0


def test_a_parameter_without_a_gradient_this_step_is_not_stepped() -> None:
    """Gradients are set to ``None`` before each backward, so a parameter the
    loss does not reach this step is skipped by the optimizer; zeroed
    gradients would let momentum carry it on."""
    model = _SometimesUsed()

    def loss_fn(m: _SometimesUsed, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m.calls += 1
        return m.a.sum() + (m.b.sum() if m.calls == 1 else 0.0)

    stepper = _Stepper(
        model,
        TrainConfig(optimizer="sgdm", lr=0.1, momentum=0.9),
        3,
        torch.device("cpu"),
        (),
        loss_fn,
    )
    for _ in range(3):
        stepper(torch.zeros(1), torch.zeros(1))
    assert model.b.item() == pytest.approx(0.9)  # stepped once, on step one
    assert model.a.item() == pytest.approx(1 - 0.1 - 0.19 - 0.271)


# --------------------------------------------------------------------------- train_local
def test_without_a_generator_training_is_seed_zeros() -> None:
    cfg = TrainConfig(lr=0.1, batch_size=4, epochs=2)
    runs = []
    for generator in (None, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)):
        model = _linear()
        train_local(model, _data(), cfg, generator=generator, transform=_flip_some)
        runs.append(model[1].weight.detach().clone())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def _flip_some(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """An augmentation that draws from the generator train_local hands it."""
    flip = torch.rand(x.shape[0], generator=g) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x).float() / 255


def test_the_hooks_the_bar_and_the_record_see_every_step_in_order() -> None:
    """``on_batch`` gets step numbers 0..T-1; the bar is named by default
    "local training" and counts T steps; the seconds are this call's."""
    seen: list[int] = []
    bars = RecordingBoard()
    before = time.perf_counter()
    stats = train_local(
        _linear(),
        _data(),
        TrainConfig(batch_size=4, steps=5),
        progress=bars,
        on_batch=lambda step, x, y: seen.append(step),
    )
    elapsed = time.perf_counter() - before
    assert seen == [0, 1, 2, 3, 4]
    assert [(b.name, b.total, len(b.descriptions), b.closed) for b in bars.bars] == [
        ("local training", 5, 5, True)
    ]
    assert 0 < stats.seconds <= elapsed


class _OneWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))


def test_the_schedule_spans_the_runs_steps() -> None:
    """A loss of gradient 1 moves the weight by the lr of each step: with a
    cosine over the 4 steps of the run (batches of 4 of 12 samples, so the
    run crosses an epoch), the lrs are 0.1·½(1 + cos(πt/4)), t = 0..3."""
    model = _OneWeight()
    cfg = TrainConfig(lr=0.1, schedule="cosine", batch_size=4, steps=4)
    train_local(model, _data(), cfg, loss_fn=lambda m, x, y: m.w * 1.0)
    lrs = [0.1 * 0.5 * (1 + math.cos(math.pi * t / 4)) for t in range(4)]
    assert model.w.item() == pytest.approx(1 - sum(lrs), abs=1e-6)


def test_what_training_says_is_logged_under_its_name_and_collected(caplog) -> None:
    def diverging(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return m(x).sum() * float("nan")

    with caplog.at_level(logging.WARNING, "osfl.fl.training"), collect_training_warnings() as got:
        stats = train_local(
            _linear(), _data(), TrainConfig(batch_size=4), loss_fn=diverging, description="client 7"
        )
    assert stats.warnings and "diverged" in stats.warnings[0]
    assert got == list(stats.warnings)
    assert [r.getMessage() for r in caplog.records] == [f"client 7: {w}" for w in stats.warnings]


def test_warnings_reported_from_a_cache_hit_reach_the_collector() -> None:
    with collect_training_warnings() as got:
        report_training_warnings(["loss rose", "underfitted"])
    assert got == ["loss rose", "underfitted"]
    report_training_warnings(["outside any block: dropped"])  # and nothing raises


def test_on_a_device_the_model_tally_and_bar_stay_there_and_no_step_waits() -> None:
    """The simulated GPU (tests/support/simulated_device.py): the model goes
    to the device, the tally sums there, the bar copies the loss without
    waiting; after the first step (warm-up) no step makes the host wait."""
    marks: list[int] = []
    with simulated_device() as dev, count_syncs() as log:
        model = _linear()
        train_local(
            model,
            _data(),
            TrainConfig(batch_size=2, steps=6),
            device=dev,
            progress=RecordingBoard(enabled=True),
            generator=torch.Generator().manual_seed(1),
            on_batch=lambda *_: marks.append(len(log)),
        )
        assert all(p.device == dev for p in model.parameters())
    assert [b - a for a, b in itertools.pairwise(marks)] == [0] * 5
    assert [e.kind for e in log.events[marks[-1] :]] == ["read"]  # the tally, once, at the end


def test_init_model_draws_from_the_runs_global_init_seed() -> None:
    class _Run:
        seed = 11

        class model:  # stands in for a ModelSpec
            @staticmethod
            def build(num_classes: int) -> nn.Module:
                return nn.Linear(4, num_classes)

        num_classes = 3

    state = torch.random.get_rng_state()
    built = init_model(_Run())  # type: ignore[arg-type]
    assert torch.equal(torch.random.get_rng_state(), state)  # the global stream untouched
    torch.manual_seed(derive_seed(11, "global-init"))
    assert torch.equal(built.weight, nn.Linear(4, 3).weight)


# --------------------------------------------------------------------------- the loss bar
def _shown(bar: RecordedBar) -> list[float | None]:
    return [None if d is None else float(d.rsplit(" ", 1)[1]) for d in bar.descriptions]


@pytest.mark.parametrize(("total", "every"), [(20, 1), (30, 1), (40, 2), (45, 2)])
def test_on_the_cpu_the_bar_shows_the_current_loss_about_twenty_times(total: int, every: int):
    bars = RecordingBoard(enabled=True)
    with _LossBar(bars, "fit", total, torch.device("cpu")) as bar:
        for step in range(1, total + 1):
            bar.advance(step, torch.tensor(step / 8))
    shown = _shown(bars.bars[0])
    assert shown == [s / 8 if s % every == 0 else None for s in range(1, total + 1)]
    assert bars.bars[0].descriptions[every - 1] == f"fit  loss {every / 8:.4f}"
    assert bars.bars[0].closed


def test_a_hidden_bar_never_reads_the_loss() -> None:
    bars = RecordingBoard()
    with _LossBar(bars, "fit", 20, None) as bar:
        for step in range(1, 21):
            bar.advance(step, torch.tensor(1.0))
    assert bars.bars[0].descriptions == [None] * 20


def test_off_the_cpu_the_bar_shows_the_previous_copy_and_never_waits() -> None:
    """The device path: a non-blocking copy per update, shown one update
    later (the first update shows nothing)."""
    losses = [torch.tensor(0.25 * s) for s in range(1, 6)]
    with emulate_device_path():
        bars = RecordingBoard(enabled=True)
        with _LossBar(bars, "fit", 5, torch.device("cpu")) as bar:
            for step, loss in enumerate(losses, 1):
                bar.advance(step, loss)
    assert _shown(bars.bars[0]) == [None, 0.25, 0.5, 0.75, 1.0]
    with simulated_device() as dev, count_syncs() as log:
        bars = RecordingBoard(enabled=True)
        with _LossBar(bars, "fit", 5, dev) as bar:
            for step, loss in enumerate(losses, 1):
                bar.advance(step, loss.to(dev))
        assert _shown(bars.bars[0]) == [None, 0.25, 0.5, 0.75, 1.0]
    assert [e for e in log.events if e.kind != "h2d"] == []  # the losses' own uploads aside


class _Event:
    """torch.cuda.Event's two calls the bar makes; ``landed`` says what query answers."""

    landed = False
    made: ClassVar[list[_Event]] = []

    def __init__(self):
        self.recorded = False
        _Event.made.append(self)

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        return _Event.landed


def test_on_cuda_the_bar_copies_into_pinned_memory_and_shows_a_copy_once_it_landed(
    monkeypatch,
) -> None:
    empty, pinned = torch.empty, []

    def host_buffer(*size, pin_memory: bool = False, **kw) -> torch.Tensor:
        pinned.append(pin_memory)  # the CPU build cannot pin: recorded, not done
        return empty(*size, **kw)

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(_Event, "made", [])
    bars = RecordingBoard(enabled=True)
    bar = _LossBar(bars, "fit", 5, CUDA)
    monkeypatch.setattr(torch, "empty", host_buffer)
    monkeypatch.setattr(_Event, "landed", False)
    bar.advance(1, torch.tensor(0.5, dtype=torch.float64))
    bar.advance(2, torch.tensor(0.75, dtype=torch.float64))  # the first copy has not landed
    monkeypatch.setattr(_Event, "landed", True)
    bar.advance(3, torch.tensor(1.0, dtype=torch.float64))  # shows the latest copy: step 2's
    assert _shown(bars.bars[0]) == [None, None, 0.75]
    assert pinned == [True] and bar.host.dtype == torch.float64
    assert len(_Event.made) == 3 and all(e.recorded for e in _Event.made)


def test_the_loss_read_off_the_cpu_keeps_its_dtype() -> None:
    with emulate_device_path():
        bar = _LossBar(RecordingBoard(enabled=True), "fit", 1, torch.device("cpu"))
        bar.advance(1, torch.tensor(1 / 3, dtype=torch.float64))
    assert bar.host.dtype == torch.float64 and bar.host.item() == 1 / 3


def test_a_bar_without_a_device_reads_on_the_host() -> None:
    bars = RecordingBoard(enabled=True)
    with _LossBar(bars, "fit", 2, None) as bar:
        bar.advance(1, torch.tensor(2.0))
    assert _shown(bars.bars[0]) == [2.0] and bar.host is None and bar.cuda is False
