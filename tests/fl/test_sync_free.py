"""A training step that never waits on the CPU (issue #40), counted on a
simulated GPU: ``tests/support/simulated_device.py``'s :func:`count_syncs` logs
every op that would make the host wait for a CUDA device (a value read, a
blocking copy either way, ``nonzero()`` and boolean indexing, an explicit
synchronize). After the first step (warm-up: the data, the model and the
constants go to the device) a plain step and a FAFI SALT step log none,
epoch boundaries included, and the whole training reads the device once, at
the end; so does the batched-clients step. Before this work a crop-flip step waited 4 times and a SALT step
about 75 times.

The device path that makes this so differs from the CPU's in its random
stream (augmentations drawn on the device), so it runs off the CPU only; the
CPU path keeps today's numbers (checked here structurally, and by the
README's numbers in ``tests/docs/test_docs.py``). What needs a real GPU (fused
optimizers, channels_last and cudnn.benchmark, bf16 autocast,
``torch.compile``) is checked here only as far as a CPU can: see TESTING.md.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.loader import BatchIterator, client_loader
from osfl.data.transforms import (
    Normalize,
    augmentation_generator,
    build_transform,
    device_path,
    emulate_device_path,
)
from osfl.fl.batched_training import train_batched
from osfl.fl.optim import fused as fuse
from osfl.fl.progress import Progress
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import _is_convnet, _Stepper, train_local
from osfl.methods.fafi.client import FAFINet, TwoViews
from osfl.methods.fafi.losses import _masked_mean_nll
from osfl.methods.fafi.salt import SaltLoss
from osfl.models import create_model, list_models
from support.simulated_device import DEVICE_TYPE, SyncLog, count_syncs, simulated_device
from support.smoke import one_torch_thread, small_model_kwargs  # noqa: F401  (an autouse fixture)


def _data(n: int = 40, size: int = 16) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 4, classes=("a", "b", "c", "d"))


class _ShownProgress(Progress):
    """A board that asks for the loss in its bars (and draws nothing)."""

    enabled = True


def _per_step(marks: list[int]) -> list[int]:
    """Waits logged in each step after the first (``marks``: the count at each step's end)."""
    return [b - a for a, b in itertools.pairwise(marks)]


def _train_counting(
    model: nn.Module, cfg: TrainConfig, transform, loss_fn=None
) -> tuple[SyncLog, list[int]]:
    with simulated_device() as dev, count_syncs() as log:
        marks: list[int] = []
        train_local(model, _data(), cfg, transform=transform, device=dev, loss_fn=loss_fn,
                    generator=torch.Generator().manual_seed(1), progress=_ShownProgress(),
                    on_batch=lambda step, x, y: marks.append(len(log)))  # fmt: skip
    return log, marks


# --------------------------------------------------------------------------- the counter
def test_the_counter_sees_every_wait_cuda_would_make() -> None:
    with simulated_device() as dev, count_syncs() as log:
        w = torch.randn(6).to(dev)
        waits = {
            "item": lambda: w.sum().item(),
            "bool": lambda: bool((w > 0).any()),
            "float": lambda: float(w.sum()),
            "cpu": lambda: w.cpu(),
            "tolist": lambda: w.tolist(),
            "nonzero": lambda: (w > 0).nonzero(),
            "boolean index": lambda: w[w > 0],
            "boolean assignment": lambda: w.clone().__setitem__(w > 0, 0.0),
            "cpu mask": lambda: w[torch.tensor([True, False] * 3)],
            "cpu indices": lambda: w[torch.tensor([0, 2])],
            "tensor on the device": lambda: torch.tensor([1.0, 2.0], device=dev),
            "blocking upload": lambda: torch.ones(3).to(dev),
            "synchronize": lambda: torch.cuda.synchronize(),
        }
        free = {
            "where": lambda: torch.where(w > 0, w, 0.0),
            "masked sum": lambda: (w * (w > 0)).sum(),
            "cpu scalar": lambda: w * torch.tensor(2.0),
            "non-blocking upload": lambda: torch.ones(3).to(dev, non_blocking=True),
            "integer index": lambda: w[torch.arange(3, device=dev)],
            "draw on the device": lambda: torch.rand(
                3, device=dev, generator=torch.Generator(device=dev)
            ),
        }
        counts = {}
        for name, op in {**waits, **free}.items():
            before = len(log)
            op()
            counts[name] = len(log) - before
    assert {k: counts[k] for k in waits} == dict.fromkeys(waits, 1)
    assert {k: counts[k] for k in free} == dict.fromkeys(free, 0)
    assert all(e.where for e in log.events)


def test_a_cpu_generator_driving_a_device_batch_waits_per_batch() -> None:
    """What the step did before: each random draw on the CPU, then a blocking copy."""
    tf = build_transform("simclr", image_size=16, mean=[0.5] * 3, std=[0.25] * 3)
    with simulated_device() as dev, count_syncs() as log:
        x = _data(8).images.to(dev)
        tf(x, torch.Generator(device=dev).manual_seed(0))  # warm-up: constants
        before = len(log)
        tf(x, torch.Generator().manual_seed(0))
        assert len(log) - before >= 5 and {e.kind for e in log.since(before)} == {"h2d"}
        before = len(log)
        tf(x, torch.Generator(device=dev).manual_seed(0))
        assert len(log) == before


# --------------------------------------------------------------------------- the steps
@pytest.mark.parametrize("augment", ["crop_flip", "simclr"])
def test_a_plain_step_never_waits_after_warm_up(augment: str) -> None:
    """Two epochs of 5 steps (the epoch boundary included), with momentum,
    clipping, a cosine schedule and a progress bar that shows the loss."""
    cfg = TrainConfig(epochs=2, batch_size=8, lr=0.05, optimizer="sgdm", schedule="cosine",
                      grad_clip=1.0)  # fmt: skip
    tf = build_transform(augment, image_size=16, mean=[0.5] * 3, std=[0.25] * 3)
    torch.manual_seed(0)
    log, marks = _train_counting(create_model("cnn_small", num_classes=4), cfg, tf)
    assert len(marks) == 10
    assert _per_step(marks) == [0] * 9, log.since(marks[0])
    # the statistics are read once, at the end
    assert [e.op for e in log.since(marks[-1])] == ["Tensor.tolist"]


@pytest.mark.parametrize(
    "loss",
    [
        SaltLoss(),
        SaltLoss(ssl_denominator="all", proto_denominator="all", ce_weight=0.5, sep_weight=0.5),
        SaltLoss(ssl_labels=False, proto_similarity="unit_feature", proto_denominator="all"),
    ],
    ids=["paper", "public-code-terms", "simclr-unit-feature"],
)
def test_a_salt_step_never_waits_after_warm_up(loss: SaltLoss) -> None:
    """FAFI's SALT step: two simclr views (ColorJitter without nonzero), the
    contrastive and prototype terms as masked means (no boolean index)."""
    cfg = TrainConfig(epochs=2, batch_size=8, lr=0.05, optimizer="sgdm")
    tf = TwoViews(build_transform("simclr", image_size=16, mean=[0.5] * 3, std=[0.25] * 3))
    torch.manual_seed(0)
    net = FAFINet(create_model("cnn_small", num_classes=4), 4, feature_dim=32)
    log, marks = _train_counting(net, cfg, tf, loss_fn=loss)
    assert _per_step(marks) == [0] * 9, log.since(marks[0])
    assert len(log.since(marks[-1])) == 1


def test_batched_clients_never_wait_per_step() -> None:
    """``batch_clients``' vmapped step: the waits do not grow with the number
    of steps (1 epoch or 3: the same count, all of it warm-up uploads), and
    each client's statistics are read once."""

    def waits(epochs: int) -> SyncLog:
        data = _data(44)
        datas = [data.subset(list(range(20))), data.subset(list(range(20, 44)))]
        tf = build_transform("crop_flip", image_size=16, mean=[0.5] * 3, std=[0.25] * 3)
        with simulated_device() as dev, count_syncs() as log:
            torch.manual_seed(0)
            train_batched(create_model("cnn_small", num_classes=4), datas,
                          TrainConfig(epochs=epochs, batch_size=8, lr=0.05),
                          [torch.Generator().manual_seed(s) for s in (3, 4)],
                          transform=tf, device=dev)  # fmt: skip
        return log

    # the device path's constants (osfl.data.device_path._const) are uploaded
    # once per process: warm them up, so the test passes alone too
    waits(1)
    one, three = waits(1), waits(3)
    assert len(one) == len(three)
    reads = [e for e in three.events if e.kind != "h2d"]
    assert [e.op for e in reads] == ["Tensor.tolist"] * 2


# --------------------------------------------------------------------------- the two paths
def test_the_cpu_path_is_todays() -> None:
    """On the CPU nothing changes: the augmentations draw from the run's own
    generator (interleaved with the loader's permutations, as before), the
    loader is the plain one, the constants are the same values."""
    g = torch.Generator().manual_seed(3)
    cpu = torch.device("cpu")
    assert not device_path(cpu)
    assert augmentation_generator(g, cpu) is g
    assert type(client_loader(_data(), 8, False, g, cpu)) is BatchIterator
    seen: list[torch.Generator | None] = []

    def spy(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        seen.append(generator)
        return x.float() / 255

    train_local(create_model("cnn_small", num_classes=4), _data(), TrainConfig(batch_size=8),
                transform=spy, generator=g)  # fmt: skip
    assert seen and all(s is g for s in seen)
    norm = Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
    x = torch.rand(2, 3, 4, 4)
    m, s = norm._stats(x)
    assert m is norm._stats(x)[0]  # made once per device and dtype
    fresh = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)
    assert torch.equal(m, fresh) and torch.equal(norm(x), (x - fresh) / s)


def test_the_augmentation_generator_is_fixed_by_the_run_seed() -> None:
    """Off the CPU: a generator on the device, seeded from the run
    generator's state without advancing it (the loader draws from it alone)."""
    with simulated_device() as dev:
        a, b, c = (torch.Generator().manual_seed(s) for s in (7, 7, 8))
        ga, gb, gc = (augmentation_generator(g, dev) for g in (a, b, c))
        assert ga.device.type == DEVICE_TYPE and ga is not a
        draw = lambda g: torch.rand(5, device=dev, generator=g).cpu()  # noqa: E731
        assert torch.equal(draw(ga), draw(gb)) and not torch.equal(draw(ga), draw(gc))
        assert torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))
        on_device = torch.Generator(device=dev)
        assert augmentation_generator(on_device, dev) is on_device
    with emulate_device_path():
        g = torch.Generator().manual_seed(7)
        assert augmentation_generator(g, "cpu") is not g


def test_the_salt_mean_without_boolean_indexing_is_the_same_mean() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 12, generator=g, requires_grad=True)
    pos = torch.rand(12, 12, generator=g) < 0.3
    pos[3] = False  # an anchor without positives
    den = torch.rand(12, 12, generator=g) < 0.7
    den[5] = False  # ... and one without a denominator
    cpu = _masked_mean_nll(logits, pos, den)
    with emulate_device_path():
        dev = _masked_mean_nll(logits, pos, den)
        none = _masked_mean_nll(logits, torch.zeros_like(pos), den)
    torch.testing.assert_close(dev, cpu, rtol=1e-6, atol=1e-6)
    (grad_cpu,) = torch.autograd.grad(cpu, logits)
    (grad_dev,) = torch.autograd.grad(dev, logits)
    torch.testing.assert_close(grad_dev, grad_cpu, rtol=1e-6, atol=1e-7)
    assert none.item() == 0.0 and none.requires_grad  # no valid anchor: zero with a graph


# --------------------------------------------------------------------------- GPU settings
@pytest.mark.parametrize(
    ("optimizer", "cls"),
    [
        ("sgd", torch.optim.SGD),
        ("nesterov", torch.optim.SGD),
        ("adam", torch.optim.Adam),
        ("adamw", torch.optim.AdamW),
    ],
)
def test_optimizers_are_fused_on_cuda_only(optimizer: str, cls: type) -> None:
    """The rebuild keeps every hyper-parameter; torch's CPU build has the fused
    kernels too, so it can be built here (it runs on CUDA only)."""
    from osfl.fl.optim import build_optimizer

    cfg = TrainConfig(optimizer=optimizer, lr=0.1, weight_decay=0.01)
    params = list(nn.Linear(3, 2).parameters())
    plain = build_optimizer(params, cfg)
    assert fuse(plain, torch.device("cpu")) is plain
    fused = fuse(plain, torch.device("cuda"))
    assert type(fused) is cls and fused.defaults["fused"] is True
    same = {k: v for k, v in plain.defaults.items() if k not in ("fused", "foreach")}
    assert {k: fused.defaults[k] for k in same} == same
    assert fused.param_groups[0]["params"] == params


def test_train_compile_is_off_by_default_and_cuda_only() -> None:
    assert TrainConfig().compile is False and TrainConfig().amp is True
    model = nn.Linear(3, 2)
    stepper = _Stepper(model, TrainConfig(compile=True), 1, torch.device("cpu"), (), None)
    assert stepper.forward_model is model


def test_every_convnet_runs_in_channels_last() -> None:
    """On CUDA convnets train in channels_last: a ``.view`` on a conv output
    would fail there only. Checked on the CPU, which has channels_last too."""
    convnets = []
    for name in list_models():
        torch.manual_seed(0)
        model = create_model(name, num_classes=5, **small_model_kwargs(name))
        if not _is_convnet(model):
            assert hasattr(model, "patch_embed"), name  # only ViTs' patch embeddings
            continue
        convnets.append(name)
        size = (32, 32) if name in ("lenet5", "cnn_small") else (16, 16)
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
        ref = model.eval()(x)
        model.to(memory_format=torch.channels_last)
        out = model(x.contiguous(memory_format=torch.channels_last))
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        model.train()(x.contiguous(memory_format=torch.channels_last)).sum().backward()
    assert {"cnn_small", "resnet18"} <= set(convnets)
