"""Synthetic pool, distillation loop, pixel inversion and DENSE's generator."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from osfl.data.transforms import Compose, Normalize, ToFloat
from osfl.errors import ConfigError, DataError
from osfl.methods.kd.distill import DistillConfig, Distiller, kd_objective
from osfl.methods.kd.generator import Generator, synthesize
from osfl.methods.kd.pixels import InversionConfig, Jitter, invert, random_labels
from osfl.methods.kd.pool import PoolBatch, SyntheticPool
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher


# --------------------------------------------------------------------------- pool
def test_pool_grows_caps_fifo_and_keeps_extras_aligned() -> None:
    pool = SyntheticPool(max_size=5)
    for i in range(3):
        pool.add(
            torch.full((2, 1, 2, 2), float(i)),
            torch.full((2,), i),
            logits=torch.full((2, 3), float(i)),
        )
    assert len(pool) == 5 and pool.total_added == 6
    assert pool.labels.tolist() == [0, 1, 1, 2, 2]  # the oldest sample went first
    seen = torch.cat(
        [b.labels for b in pool.batches(2, generator=torch.Generator().manual_seed(0))]
    )
    assert sorted(seen.tolist()) == [0, 1, 1, 2, 2]  # one pass = every sample once
    for b in pool.batches(3):
        assert torch.equal(b.images[:, 0, 0, 0], b.labels.float())
        assert torch.equal(b.extras["logits"][:, 0], b.labels.float())
    assert len(list(pool.batches(2, drop_last=True))) == 2
    assert pool.sample(10).images.shape[0] == 5


def test_pool_refuses_inconsistent_batches() -> None:
    pool = SyntheticPool()
    assert not PoolBatch(torch.zeros(1, 1, 1, 1), torch.tensor([-1])).has_labels
    pool.add(torch.zeros(2, 1, 4, 4))  # unlabelled: -1
    assert pool.labels.tolist() == [-1, -1]
    with pytest.raises(DataError):
        pool.add(torch.zeros(2, 1, 8, 8))
    with pytest.raises(DataError):
        pool.add(torch.zeros(2, 1, 4, 4), logits=torch.zeros(2, 3))
    with pytest.raises(DataError):
        pool.add(torch.zeros(2, 1, 4, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError):
        SyntheticPool(max_size=0)
    with pytest.raises(DataError):
        SyntheticPool().sample(1)


# --------------------------------------------------------------------------- distillation
def test_kd_objective_combines_kl_and_ce_by_hand() -> None:
    s = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    t = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    cfg = DistillConfig(kd_weight=2.0, ce_weight=0.5)
    y = torch.tensor([0, -1])  # the unlabelled sample is left out of CE
    expected = 2.0 * kl + 0.5 * math.log(2.0)
    assert float(kd_objective(s, t, y, cfg)) == pytest.approx(expected, rel=1e-6)
    assert float(
        kd_objective(s, None, y, DistillConfig(kd_weight=0.0, ce_weight=1.0))
    ) == pytest.approx(math.log(2.0))
    with pytest.raises(ConfigError):
        kd_objective(s, None, y, DistillConfig())


def test_distiller_fits_the_teacher_on_the_pool() -> None:
    torch.manual_seed(0)
    teacher = EnsembleTeacher([nn.Sequential(nn.Flatten(), nn.Linear(4, 3)) for _ in range(2)])
    student = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    pool = SyntheticPool()
    pool.add(torch.randn(64, 1, 2, 2), random_labels(64, 3))
    cfg = DistillConfig(batch_size=16, optimizer="adam", lr=0.05, schedule="cosine")
    d = Distiller(student, teacher, cfg, epochs=20, generator=torch.Generator().manual_seed(0))
    first = d.fit_pool(pool)
    assert first.steps == 4 and first.samples == 64  # one pass over the pool
    for _ in range(19):
        last = d.fit_pool(pool)
    assert last.mean_loss < 0.2 * first.mean_loss
    assert d.epochs_done == 20 and d.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)
    assert d.fit_pool(pool, steps=7).steps == 7  # fixed step budgets cycle over the pool


def test_distill_config_refuses_bad_values() -> None:
    for bad in (
        {"lr": 0.0},
        {"temperature": 0.0},
        {"optimizer": "lbfgs"},
        {"steps": 0},
        {"ce_weight": -1.0},
    ):
        with pytest.raises(ConfigError):
            DistillConfig(**bad)


# --------------------------------------------------------------------------- pixels
def tiny_cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)
    ).eval()


def test_inversion_lowers_the_classification_loss() -> None:
    model = tiny_cnn()
    y = torch.tensor([0, 1, 2, 0])
    cfg = InversionConfig(
        iterations=30, lr=0.1, tv_l2_weight=0.0, jitter=0, flip=False, keep="last"
    )
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(4, 1, 4, 4, generator=gen)
    with torch.no_grad():
        before = float(nn.functional.cross_entropy(model(init), y))
    res = invert(lambda x, s: model(x), y, (1, 4, 4), cfg, generator=gen, init=init)
    assert res.images.shape == (4, 1, 4, 4) and torch.equal(res.labels, y)
    with torch.no_grad():
        after = float(nn.functional.cross_entropy(model(res.images), y))
    assert after < 0.5 * before


def test_inversion_clips_to_the_pixel_range_and_freezes_masked_pixels() -> None:
    model = tiny_cnn()
    space = InputSpace((0.5,), (0.25,))  # valid inputs: [-2, 2]
    mask = torch.ones(1, 1, 4, 4)
    mask[..., :2, :] = 0  # the top half is "stopped"
    init = torch.randn(2, 1, 4, 4)

    def on_step(state):
        state.update_mask = mask

    cfg = InversionConfig(iterations=10, lr=0.5, jitter=0, flip=False, keep="last")
    res = invert(
        lambda x, s: model(x),
        torch.tensor([0, 1]),
        (1, 4, 4),
        cfg,
        space=space,
        init=init,
        on_step=on_step,
    )
    assert float(res.images.min()) >= -2 - 1e-6 and float(res.images.max()) <= 2 + 1e-6
    # after the first step the mask is set: the top rows never move again
    first = space.clip(init)
    res1 = invert(
        lambda x, s: model(x),
        torch.tensor([0, 1]),
        (1, 4, 4),
        InversionConfig(iterations=1, lr=0.5, jitter=0, flip=False, keep="last"),
        space=space,
        init=init,
    )
    assert not torch.equal(res1.images[..., :2, :], first[..., :2, :])
    assert torch.equal(res.images[..., :2, :], res1.images[..., :2, :])
    assert not torch.equal(res.images[..., 2:, :], res1.images[..., 2:, :])


def test_inversion_bn_and_js_terms_are_reported() -> None:
    from osfl.methods.kd.priors import BNStatsLoss

    model, student = tiny_cnn(), tiny_cnn()
    cfg = InversionConfig(
        iterations=3, bn_weight=1.0, js_weight=1.0, l2_weight=1e-3, tv_l1_weight=1.0
    )
    res = invert(
        lambda x, s: model(x),
        torch.tensor([0, 1]),
        (1, 4, 4),
        cfg,
        bn=BNStatsLoss([model]),
        student=lambda x, s: student(x),
    )
    assert set(res.losses) == {"ce", "bn", "tv_l1", "tv_l2", "l2", "js"}
    assert res.losses["js"] <= 0  # the competition term is a negative JS
    with pytest.raises(ConfigError):
        invert(lambda x, s: model(x), torch.tensor([0]), (1, 4, 4), cfg)  # js without a student


def test_jitter_roll_and_flip() -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4)
    assert torch.equal(Jitter(1, 0, False).apply(x)[0, 0, 1], x[0, 0, 0])
    assert torch.equal(Jitter(0, 0, True).apply(x)[0, 0, 0], x[0, 0, 0].flip(0))
    j = Jitter.draw(2, True, torch.Generator().manual_seed(3))
    assert abs(j.dy) <= 2 and abs(j.dx) <= 2
    assert Jitter.draw(0, False, None) == Jitter()
    with pytest.raises(ConfigError):
        InversionConfig(keep="first")


def test_input_space_from_a_transform_pipeline() -> None:
    space = InputSpace.from_transform(Compose([ToFloat(), Normalize((0.5,), (0.5,))]), 1)
    assert space == InputSpace((0.5,), (0.5,))
    x = torch.rand(2, 1, 3, 3)
    assert torch.allclose(space.denormalize(space.normalize(x)), x)
    assert InputSpace.from_transform(ToFloat(), 3) == InputSpace.identity(3)
    assert space.to_uint8(space.normalize(torch.ones(1, 1, 1, 1))).item() == 255


# --------------------------------------------------------------------------- generator
@pytest.mark.parametrize(
    "size,init,blocks", [(8, 2, 2), (16, 4, 2), (32, 8, 2), (28, 7, 2), (64, 8, 3)]
)
def test_generator_shape_and_range(size: int, init: int, blocks: int) -> None:
    g = Generator(nz=16, ngf=8, img_size=size, channels=3)
    assert (g.init_size, g.num_blocks) == (init, blocks)
    with torch.no_grad():
        x = g(torch.randn(4, 16))
    assert x.shape == (4, 3, size, size)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0 and g.output_space == "pixels"


def test_dense_generator_matches_the_paper_layout_at_32px() -> None:
    g = Generator()  # nz=256, ngf=64
    assert g.l1.out_features == 128 * 8 * 8  # z=256 -> 128x8x8
    assert g(torch.randn(2, 256)).shape == (2, 3, 32, 32)


def test_conditional_generator_and_tanh_outputs() -> None:
    g = Generator(nz=10, ngf=8, img_size=8, channels=1, num_classes=4, output="tanh_bn")
    x = g(torch.randn(6, 10), torch.tensor([0, 1, 2, 3, 0, 1])).detach()
    assert x.shape == (6, 1, 8, 8) and g.output_space == "inputs"
    assert float(x.mean()) == pytest.approx(0.0, abs=1e-5)  # non-affine BN output
    t = Generator(nz=10, ngf=8, img_size=8, channels=1, output="tanh")(torch.randn(3, 10)).detach()
    assert float(t.abs().max()) <= 1.0
    with pytest.raises(ConfigError):
        g(torch.randn(2, 10))  # labels needed
    with pytest.raises(ConfigError):
        Generator(output="relu")
    with pytest.raises(ConfigError):
        Generator(img_size=0)


def test_synthesize_returns_the_best_normalised_batch() -> None:
    g = Generator(nz=8, ngf=4, img_size=8, channels=1)
    space = InputSpace((0.5,), (0.25,))
    costs: list[float] = []

    def loss_fn(x: torch.Tensor, y: torch.Tensor):
        loss = (x - 1.0).pow(2).mean()
        costs.append(float(loss.detach()))
        return loss, {"mse": float(loss.detach())}

    x, terms = synthesize(
        g,
        torch.zeros(4, dtype=torch.long),
        loss_fn,
        iterations=15,
        lr=0.05,
        space=space,
        rng=torch.Generator().manual_seed(0),
    )
    assert x.shape == (4, 1, 8, 8)
    assert terms["mse"] == pytest.approx(min(costs))
    assert (
        float(x.min()) >= -2.0 - 1e-5 and float(x.max()) <= 2.0 + 1e-5
    )  # normalised sigmoid range
    assert min(costs) < costs[0]


def test_synthesize_keeps_the_un_augmented_batch_of_the_lowest_loss_step() -> None:
    """DENSE's and Co-Boosting's ``synthesize`` keep ``best_inputs =
    inputs.data`` of the step with the lowest loss: the generator's output
    *before* the augmentation the loss saw, and of that step, not the last.
    Here the augmentation is deterministic and visible (a flip, halved and
    shifted), and the loss is scripted so that its minimum lies at step 2 of
    6 while the generator keeps moving (each step's gradient is real)."""
    torch.manual_seed(0)
    g = Generator(nz=8, ngf=4, img_size=8, channels=1)
    costs = [5.0, 3.0, 1.0, 4.0, 2.0, 6.0]  # lowest at step 2; the last is the worst
    seen: list[torch.Tensor] = []  # the un-augmented batch of each step
    steps = iter(range(len(costs)))

    def augment(x: torch.Tensor, rng: torch.Generator | None) -> torch.Tensor:
        seen.append(x.detach().clone())
        return 0.5 * x.flip(-1) + 3.0

    def loss_fn(xa: torch.Tensor, y: torch.Tensor):
        i = next(steps)
        assert float(xa.detach().min()) >= 3.0  # the loss sees the augmented view
        moving = (xa - 3.0).mean()  # a real gradient, so the generator moves every step
        loss = moving + (costs[i] - moving.detach())  # worth exactly costs[i]
        return loss, {"step": float(i)}

    x, terms = synthesize(
        g,
        torch.zeros(4, dtype=torch.long),
        loss_fn,
        iterations=len(costs),
        lr=0.05,
        augment=augment,
        rng=torch.Generator().manual_seed(0),
    )
    assert len(seen) == len(costs)
    assert not torch.allclose(seen[2], seen[-1])  # the batches differ step to step
    torch.testing.assert_close(x, seen[2], rtol=0, atol=0)  # step 2's, un-augmented
    assert terms == {"step": 2.0}


def test_pool_sample_draws_with_the_given_generator_and_one_image_is_enough() -> None:
    pool = SyntheticPool()
    pool.add(torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1), torch.arange(6))
    torch.manual_seed(123)  # the global RNG must not be what draws
    got = pool.sample(4, generator=torch.Generator().manual_seed(7)).labels
    expect = torch.randperm(6, generator=torch.Generator().manual_seed(7))[:4]
    assert got.tolist() == expect.tolist()
    one = SyntheticPool()
    one.add(torch.zeros(1, 1, 1, 1), torch.tensor([3]))
    assert one.sample(5).labels.tolist() == [3]
    with pytest.raises(DataError, match=r"^cannot sample from an empty synthetic pool$"):
        SyntheticPool().sample(1)
