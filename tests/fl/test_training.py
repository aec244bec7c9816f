"""Local training engine: config validation, step counts, determinism, exact SGD,
schedules and optimizers (osfl.fl.training, osfl.fl.optim)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from osfl.data import loader
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, DataError
from osfl.fl import optim, training
from osfl.fl.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_at
from osfl.fl.train_config import TrainConfig
from osfl.fl.train_stats import StepTally
from osfl.fl.training import TrainStats, train_local
from support.progress import RecordingBoard


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 3, pixels: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(pixels, 8), nn.ReLU())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def make_data(n: int = 20, seed: int = 0, k: int = 3) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % k
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=labels, classes=tuple("abc"[:k]))


def make_model(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet()


def run(cfg: TrainConfig, *, data: ImageSet | None = None, seed: int = 0, **kw):
    model = make_model()
    stats = train_local(
        model,
        data if data is not None else make_data(),
        cfg,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )
    return model, stats


# --- TrainConfig ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("lr", 0.0, "lr must be > 0"),
        ("lr", float("nan"), "lr must be > 0"),
        ("batch_size", 0, "batch_size must be >= 1"),
        ("epochs", 0, "epochs must be >= 1"),
        ("steps", 0, "steps must be >= 1"),
        ("momentum", 1.0, "momentum"),
        ("weight_decay", -1.0, "weight_decay"),
        ("grad_clip", 0.0, "grad_clip"),
        ("gamma", 0.0, "gamma"),
        ("warmup_steps", -1, "warmup_steps"),
        ("optimizer", "lbfgs", "valid: adam, adamw, nesterov, sgd, sgdm"),
        ("schedule", "poly", "unknown schedule 'poly'"),
    ],
)
def test_config_refuses_bad_values(field: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        TrainConfig(**{field: value})


def test_config_is_plain_and_structurable() -> None:
    cfg = TrainConfig(steps=5, lr=0.1, optimizer="adamw")
    d = dataclasses.asdict(cfg)
    assert d["steps"] == 5 and d["optimizer"] == "adamw"
    conf = OmegaConf.merge(OmegaConf.structured(TrainConfig), {"steps": 5, "lr": 0.1})
    back = OmegaConf.to_object(conf)
    assert back == TrainConfig(steps=5, lr=0.1)


def test_total_steps() -> None:
    assert TrainConfig(epochs=3, batch_size=8).total_steps(20) == 9  # 3 * ceil(20/8)
    assert TrainConfig(epochs=3, batch_size=8, drop_last=True).total_steps(20) == 6
    assert TrainConfig(epochs=3, steps=7, batch_size=8).total_steps(20) == 7


def test_public_hparams_report_applied_momentum() -> None:
    assert TrainConfig(optimizer="sgd", momentum=0.9).public_hparams()["momentum"] == 0.0
    assert TrainConfig(optimizer="sgdm", momentum=0.9).public_hparams()["momentum"] == 0.9
    assert TrainConfig(optimizer="adam").public_hparams()["momentum"] == 0.0


# --- the loop ---------------------------------------------------------------------------


def test_counts_epochs_and_samples() -> None:
    _, stats = run(TrainConfig(epochs=2, batch_size=8))
    assert isinstance(stats, TrainStats)
    assert stats.steps == 6 and stats.samples == 40 and stats.epochs == 2.0
    assert math.isfinite(stats.mean_loss) and math.isfinite(stats.last_loss)
    assert stats.seconds >= 0


def test_amp_changes_nothing_on_cpu() -> None:
    """``train.amp`` autocasts on CUDA only: on CPU both settings train bit for bit alike."""
    with_amp, _ = run(TrainConfig(epochs=2, batch_size=8, amp=True))
    without, _ = run(TrainConfig(epochs=2, batch_size=8, amp=False))
    for k, v in with_amp.state_dict().items():
        assert v.dtype == without.state_dict()[k].dtype and torch.equal(v, without.state_dict()[k])


def test_steps_override_epochs() -> None:
    _, stats = run(TrainConfig(epochs=5, steps=7, batch_size=8))
    assert stats.steps == 7
    assert stats.epochs == pytest.approx(7 / 3)
    assert stats.samples == 8 + 8 + 4 + 8 + 8 + 4 + 8


def test_each_epoch_sees_every_sample_once() -> None:
    seen: list[torch.Tensor] = []
    data = make_data(n=10)
    run(
        TrainConfig(epochs=2, batch_size=4),
        data=data,
        on_batch=lambda step, x, y: seen.append(y.clone()),
    )
    assert [len(y) for y in seen] == [4, 4, 2, 4, 4, 2]
    first, second = torch.cat(seen[:3]), torch.cat(seen[3:])
    assert torch.equal(first.sort().values, data.labels.sort().values)
    assert torch.equal(second.sort().values, data.labels.sort().values)


def test_drop_last() -> None:
    _, stats = run(TrainConfig(epochs=1, batch_size=8, drop_last=True))
    assert stats.steps == 2 and stats.samples == 16
    with pytest.raises(DataError, match="fewer than batch_size"):
        run(TrainConfig(batch_size=32, drop_last=True))


def test_empty_data_refused() -> None:
    empty = ImageSet(
        images=torch.zeros(0, 1, 4, 4, dtype=torch.uint8),
        labels=torch.zeros(0, dtype=torch.int64),
        classes=("a", "b", "c"),
    )
    with pytest.raises(DataError, match="empty"):
        run(TrainConfig(), data=empty)


def test_deterministic_for_a_seed() -> None:
    cfg = TrainConfig(epochs=2, batch_size=8, optimizer="sgdm", lr=0.05)
    a, sa = run(cfg, seed=3)
    b, sb = run(cfg, seed=3)
    c, _ = run(cfg, seed=4)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert sa.mean_loss == sb.mean_loss
    assert any(
        not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True)
    )


def test_equals_a_hand_written_sgd_loop() -> None:
    """The engine performs exactly w <- w - lr * grad(CE) on the batches it reports."""
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    cfg = TrainConfig(epochs=2, batch_size=8, optimizer="sgd", lr=0.1)
    trained, stats = run(cfg, on_batch=lambda s, x, y: batches.append((x.clone(), y.clone())))
    ref = make_model()
    losses = []
    for x, y in batches:
        loss = nn.functional.cross_entropy(ref(x), y)
        ref.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.1 * p.grad
        losses.append(loss.item())
    for p, q in zip(trained.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert stats.mean_loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert stats.last_loss == pytest.approx(losses[-1], rel=1e-5)


def test_default_input_is_scaled_to_unit_range() -> None:
    xs: list[torch.Tensor] = []
    data = make_data()
    run(TrainConfig(steps=1, batch_size=20), data=data, on_batch=lambda s, x, y: xs.append(x))
    assert xs[0].dtype == torch.float32
    order = torch.cat(
        [torch.nonzero((data.images.float() / 255 == xi).all(dim=(1, 2, 3))) for xi in xs[0]]
    )
    assert len(order) == 20  # every transformed sample is an input image / 255


def test_transform_and_loss_fn_are_used() -> None:
    calls = {"t": 0, "loss": 0}

    def transform(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        calls["t"] += 1
        assert x.dtype == torch.uint8 and generator is not None
        return x.float() / 255 - 0.5

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls["loss"] += 1
        assert x.min() >= -0.5 and x.max() <= 0.5
        return model(x).pow(2).mean()

    _, stats = run(TrainConfig(steps=4, batch_size=8), transform=transform, loss_fn=loss_fn)
    assert calls == {"t": 4, "loss": 4} and stats.steps == 4


def test_loss_decreases_on_learnable_data() -> None:
    # labels are a function of the image, so training must fit them
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (60, 1, 4, 4), dtype=torch.uint8, generator=g)
    labels = (images[:, 0, 0, 0] > 127).long()
    data = ImageSet(images=images, labels=labels, classes=("lo", "hi"))
    torch.manual_seed(0)
    model = TinyNet(num_classes=2)
    first = train_local(model, data, TrainConfig(steps=1, batch_size=60, lr=0.5))
    later = train_local(model, data, TrainConfig(epochs=150, batch_size=60, lr=0.5))
    assert later.last_loss < 0.5 * first.last_loss


def test_frozen_parameters_stay_put() -> None:
    model = make_model()
    for p in model.body.parameters():
        p.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_local(model, make_data(), TrainConfig(steps=3, batch_size=8, lr=0.5))
    assert torch.equal(model.body[1].weight, before["body.1.weight"])
    assert not torch.equal(model.head.weight, before["head.weight"])


def test_no_trainable_parameters_refused() -> None:
    model = make_model().requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        train_local(model, make_data(), TrainConfig(steps=1))


def test_grad_clip_bounds_the_step() -> None:
    model = make_model()
    before = [p.clone() for p in model.parameters()]
    train_local(model, make_data(), TrainConfig(steps=1, batch_size=20, lr=1.0, grad_clip=1e-3))
    moved = torch.sqrt(
        sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True))
    )
    assert 0 < float(moved.detach()) <= 1e-3 * (1 + 1e-5)


def test_progress_bar_counts_every_step_and_closes() -> None:
    board = RecordingBoard(enabled=True)
    _, stats = run(TrainConfig(steps=3, batch_size=8), progress=board, description="c0")
    assert stats.steps == 3
    assert [(b.name, b.total, sum(b.advances), b.closed) for b in board.bars] == [
        ("c0", 3, 3, True)
    ]


# --- optimizers and schedules -----------------------------------------------------------


def test_optimizer_registry() -> None:
    assert OPTIMIZERS.names() == ["adam", "adamw", "nesterov", "sgd", "sgdm"]
    p = [nn.Parameter(torch.zeros(2))]
    assert build_optimizer(p, TrainConfig(optimizer="sgd")).param_groups[0]["momentum"] == 0
    sgdm = build_optimizer(p, TrainConfig(optimizer="sgdm", momentum=0.8)).param_groups[0]
    assert sgdm["momentum"] == 0.8 and not sgdm["nesterov"]
    assert build_optimizer(p, TrainConfig(optimizer="nesterov")).param_groups[0]["nesterov"]
    assert isinstance(build_optimizer(p, TrainConfig(optimizer="adam")), torch.optim.Adam)
    assert isinstance(build_optimizer(p, TrainConfig(optimizer="adamw")), torch.optim.AdamW)


@pytest.mark.parametrize("name", ["sgd", "sgdm", "nesterov", "adam", "adamw"])
def test_every_optimizer_trains(name: str) -> None:
    model, stats = run(TrainConfig(steps=3, batch_size=8, optimizer=name, lr=0.01))
    assert math.isfinite(stats.mean_loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_schedules_by_hand() -> None:
    assert SCHEDULES.names() == ["constant", "cosine", "step", "warmup_cosine"]
    assert lr_at(TrainConfig(lr=0.1), 3) == [0.1, 0.1, 0.1]
    cos = lr_at(TrainConfig(lr=1.0, schedule="cosine"), 4)
    assert cos == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    )
    step = lr_at(TrainConfig(lr=1.0, schedule="step", step_size=2, gamma=0.5), 5)
    assert step == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25])
    thirds = lr_at(TrainConfig(lr=1.0, schedule="step"), 6)
    assert thirds == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01, 0.01])
    wc = lr_at(TrainConfig(lr=1.0, schedule="warmup_cosine", warmup_steps=2), 6)
    assert wc == pytest.approx(
        [
            0.5,
            1.0,
            1.0,
            0.5 * (1 + math.cos(math.pi / 4)),
            0.5,
            0.5 * (1 + math.cos(3 * math.pi / 4)),
        ]
    )
    assert lr_at(TrainConfig(lr=1.0, warmup_steps=4), 5) == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0]
    )


def test_warmup_cosine_needs_warmup() -> None:
    with pytest.raises(ConfigError, match="warmup_steps >= 1"):
        lr_at(TrainConfig(schedule="warmup_cosine"), 3)


class OneWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0], 3)


def test_schedule_is_applied_in_training() -> None:
    # loss = w has gradient 1, so SGD moves w by exactly -lr_t at step t
    model = OneWeight()
    cfg = TrainConfig(steps=4, batch_size=8, lr=1.0, schedule="step", step_size=1, gamma=0.5)
    train_local(model, make_data(), cfg, loss_fn=lambda m, x, y: m.w.sum())
    assert float(model.w.detach()) == -(1.0 + 0.5 + 0.25 + 0.125)


def test_registered_model_with_batched_augmentation_is_deterministic() -> None:
    """cnn_small + the crop_flip pipeline: one seed fixes batch order and augmentations."""
    from osfl.data.transforms import build_transform
    from osfl.models import create_model

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (24, 3, 8, 8), dtype=torch.uint8, generator=g)
    data = ImageSet(images=images, labels=torch.arange(24) % 3, classes=("a", "b", "c"))
    transform = build_transform("crop_flip", image_size=8, mean=(0.5,) * 3, std=(0.25,) * 3)
    cfg = TrainConfig(epochs=2, batch_size=8, optimizer="sgdm", lr=0.05)

    def trained(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = create_model("cnn_small", num_classes=3)
        gen = torch.Generator().manual_seed(seed)
        stats = train_local(model, data, cfg, transform=transform, generator=gen)
        assert stats.steps == 6 and math.isfinite(stats.mean_loss)
        return model.state_dict()

    a, b, c = trained(1), trained(1), trained(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


# --- the device path (issue #40) ------------------------------------------------------


def test_the_device_path_keeps_the_batch_order_and_is_fixed_by_the_seed():
    """Off the CPU augmentations come from a device generator seeded from the
    run's (another stream than the CPU's, so other weights), the first
    epoch's batches are the CPU's (later ones differ: on the CPU the
    augmentations advance the loader's generator too), and a seed still fixes
    the whole run. Run here through emulate_device_path, the device path on
    the CPU's kernels."""
    from osfl.data.transforms import RandomHorizontalFlip, emulate_device_path
    from osfl.fl.training import record_step_labels

    flip = RandomHorizontalFlip(0.5)
    tf = lambda x, g=None: flip(x.float() / 255, g)  # noqa: E731
    cfg = TrainConfig(epochs=3, batch_size=6, lr=0.1)

    def labels_and_weights(seed: int):
        with record_step_labels() as labels:
            model, stats = run(cfg, seed=seed, transform=tf)
        return torch.cat(labels), model.head.weight.detach().clone(), stats

    cpu_labels, cpu_w, _ = labels_and_weights(1)
    with emulate_device_path():
        dev_labels, dev_w, dev_stats = labels_and_weights(1)
        again_labels, again_w, again_stats = labels_and_weights(1)
        _, other_w, _ = labels_and_weights(2)
    per_epoch = 20  # make_data(): 20 samples, every one in each epoch
    assert torch.equal(dev_labels[:per_epoch], cpu_labels[:per_epoch])
    assert not torch.equal(dev_w, cpu_w)  # ... other flips
    assert torch.equal(again_w, dev_w) and again_stats.mean_loss == dev_stats.mean_loss
    assert torch.equal(again_labels, dev_labels) and not torch.equal(other_w, dev_w)


def test_the_step_tally_reads_what_a_loop_summed() -> None:
    """StepTally (shared by train_local and the batched loop): the loss of
    every step, of the first and of the last epoch, the last epoch's accuracy;
    a custom loss (no logits) counts no accuracy."""
    tally = StepTally(total=4, per_epoch=2, device=torch.device("cpu"))
    y = torch.tensor([0, 1])
    right = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    for step, loss in enumerate([4.0, 3.0, 2.0, 1.0]):
        tally.add(step, torch.tensor(loss), right if step == 3 else None, y)
    stats = tally.stats(steps=4, epochs=2.0, seconds=0.0)
    assert (stats.first_loss, stats.final_loss, stats.mean_loss, stats.last_loss) == (
        3.5,
        1.5,
        2.5,
        1.0,
    )
    assert (stats.samples, stats.train_accuracy, stats.num_classes) == (8, 1.0, 2)


def test_the_training_module_keeps_the_loop_only() -> None:
    """The CUDA optimizer rebuild lives with the optimizers, the device loader
    with the loaders; the loop's module stays under the project's 500 lines."""
    assert hasattr(optim, "fused") and hasattr(loader, "DeviceLoader")
    assert not hasattr(training, "_fused") and not hasattr(training, "_DeviceLoader")
    if os.environ.get("MUTANT_UNDER_TEST") is None:  # mutmut's copy holds every mutant too
        assert len(inspect.getsource(training).splitlines()) < 500
