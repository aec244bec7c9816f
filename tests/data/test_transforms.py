"""Batched transforms: shapes, ranges, exact edge cases, per-sample draws, seeds."""

from __future__ import annotations

import colorsys

import pytest
import torch

from osfl.data import transforms as T
from osfl.data.batch_transforms import _GRAY
from osfl.data.device_path import _const
from osfl.errors import ConfigError, DataError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(b: int = 8, c: int = 3, h: int = 12, w: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, c, h, w, generator=gen(seed))


def same_image_batch(b: int = 16, c: int = 3, h: int = 12, w: int = 12) -> torch.Tensor:
    """B copies of one image with distinct pixel values, so crops/flips are distinguishable."""
    img = torch.arange(c * h * w, dtype=torch.float32).view(1, c, h, w) / (c * h * w)
    return img.expand(b, -1, -1, -1).contiguous()


def test_tofloat_scales_uint8_exactly():
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    y = T.ToFloat()(x)
    assert y.dtype == torch.float32 and y[0, 0, 0, 1] == 1 / 255 and y.max() == 1.0
    f = torch.rand(1, 1, 2, 2)
    assert T.ToFloat()(f) is f
    with pytest.raises(DataError, match="uint8 or float"):
        T.ToFloat()(torch.zeros(1, 1, 2, 2, dtype=torch.int32))


def test_resize_shape_identity_and_constants():
    x = batch()
    assert T.Resize(12)(x) is x
    y = T.Resize((6, 9))(x)
    assert y.shape == (8, 3, 6, 9)
    flat = torch.full((2, 3, 12, 12), 0.25)
    assert torch.allclose(T.Resize(5)(flat), torch.full((2, 3, 5, 5), 0.25))


def test_random_crop_identity_with_no_padding_full_size():
    x = batch()
    assert torch.equal(T.RandomCrop(12, padding=0)(x, gen()), x)


def test_random_crop_is_a_window_of_the_padded_image_and_varies_per_sample():
    x = same_image_batch()
    y = T.RandomCrop(12, padding=4)(x, gen(3))
    assert y.shape == x.shape
    padded = torch.nn.functional.pad(x[0], (4, 4, 4, 4))
    offsets = []
    for i in range(len(y)):
        hits = [
            (t, s)
            for t in range(9)
            for s in range(9)
            if torch.equal(y[i], padded[:, t : t + 12, s : s + 12])
        ]
        assert len(hits) == 1
        offsets.append(hits[0])
    assert len(set(offsets)) > 4  # per-sample offsets, not one per batch
    assert torch.equal(T.RandomCrop(12, padding=4)(x, gen(3)), y)  # seeded
    assert not torch.equal(T.RandomCrop(12, padding=4)(x, gen(4)), y)


def test_random_crop_of_a_rectangle_is_a_window_of_the_padded_rectangle():
    """Height and width index the flattened image separately (rows × padded width)."""
    x = torch.rand(6, 3, 9, 14)
    y = T.RandomCrop((7, 10), padding=2)(x, gen(5))
    assert y.shape == (6, 3, 7, 10)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(len(y)):
        hits = [(t, s) for t in range(7) for s in range(9)
                if torch.equal(y[i], padded[i, :, t : t + 7, s : s + 10])]  # fmt: skip
        assert len(hits) == 1


def test_random_crop_bad_args():
    with pytest.raises(ConfigError, match="padding"):
        T.RandomCrop(8, padding=-1)
    with pytest.raises(DataError, match="exceeds"):
        T.RandomCrop(20)(batch(), gen())


def test_flip_p0_p1_exact_and_per_sample():
    x = batch(32)
    assert torch.equal(T.RandomHorizontalFlip(0.0)(x, gen()), x)
    assert torch.equal(T.RandomHorizontalFlip(1.0)(x, gen()), x.flip(-1))
    y = T.RandomHorizontalFlip(0.5)(x, gen())
    flipped = [torch.equal(y[i], x[i].flip(-1)) for i in range(32)]
    kept = [torch.equal(y[i], x[i]) for i in range(32)]
    assert all(a != b for a, b in zip(flipped, kept, strict=True)) and 0 < sum(flipped) < 32
    with pytest.raises(ConfigError, match="probability"):
        T.RandomHorizontalFlip(1.5)


def test_random_resized_crop_boxes_valid_and_full_box_is_identity():
    rrc = T.RandomResizedCrop(8, scale=(0.2, 1.0))
    boxes = rrc.boxes(500, 20, 30, gen(), torch.device("cpu"))
    top, left, h, w = boxes.unbind(1)
    assert (
        (top >= 0).all() and (left >= 0).all() and (top + h <= 20).all() and (left + w <= 30).all()
    )
    area = (h * w).double() / 600
    assert area.min() >= 0.15 and area.max() <= 1.0 and len(torch.unique(boxes, dim=0)) > 400
    x = batch(4, h=10, w=10)
    full = T.RandomResizedCrop(10, scale=(1.0, 1.0), ratio=(1.0, 1.0))(x, gen())
    assert torch.allclose(full, x, atol=1e-5)


def test_random_resized_crop_range_seed_and_per_sample():
    x = same_image_batch(h=16, w=16)
    y = T.RandomResizedCrop(8)(x, gen(5))
    assert y.shape == (16, 3, 8, 8)
    assert y.min() >= x.min() - 1e-6 and y.max() <= x.max() + 1e-6  # bilinear stays in the hull
    assert torch.equal(y, T.RandomResizedCrop(8)(x, gen(5)))
    assert len({tuple(y[i].flatten()[:5].tolist()) for i in range(16)}) > 8


def test_rgb_hsv_matches_colorsys_and_round_trips():
    x = batch(2, h=4, w=4)
    hsv = T.rgb_to_hsv(x)
    for r, g, b, h, s, v in zip(*x[0].reshape(3, -1), *hsv[0].reshape(3, -1), strict=True):
        ref = colorsys.rgb_to_hsv(float(r), float(g), float(b))
        assert (h.item(), s.item(), v.item()) == pytest.approx(ref, abs=1e-5)
    assert torch.allclose(T.hsv_to_rgb(hsv), x, atol=1e-5)


def test_hue_shift_zero_is_identity_and_third_turn_maps_red_to_green():
    x = batch(4)
    assert torch.allclose(T.adjust_hue(x, torch.zeros(4)), x, atol=1e-5)
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1.0
    green = T.adjust_hue(red, torch.tensor([1 / 3]))
    assert torch.allclose(green[0, :, 0, 0], torch.tensor([0.0, 1.0, 0.0]), atol=1e-5)
    shift = torch.tensor([0.1, -0.3, 0.5, -0.05])
    hsv = T.rgb_to_hsv(x)
    via_hsv = T.hsv_to_rgb(
        torch.stack(
            (torch.remainder(hsv[:, 0] + shift.view(-1, 1, 1), 1.0), hsv[:, 1], hsv[:, 2]), 1
        )
    )
    assert torch.allclose(T.adjust_hue(x, shift), via_hsv, atol=1e-5)
    grey = torch.rand(2, 1, 3, 3)
    assert torch.equal(T.adjust_hue(grey, torch.tensor([0.3, 0.1])), grey)


def test_color_jitter_zero_is_identity_and_ranges():
    x = batch(16)
    assert torch.equal(T.ColorJitter()(x, gen()), x)
    y = T.ColorJitter(0.4, 0.4, 0.4, 0.1)(x, gen())
    assert y.shape == x.shape and y.min() >= 0 and y.max() <= 1
    assert torch.equal(y, T.ColorJitter(0.4, 0.4, 0.4, 0.1)(x, gen()))
    with pytest.raises(ConfigError, match="hue"):
        T.ColorJitter(hue=0.6)


def test_brightness_factors_are_per_sample_and_in_range():
    x = torch.full((32, 3, 4, 4), 0.5)
    y = T.ColorJitter(brightness=0.5)(x, gen())
    f = y[:, 0, 0, 0] / 0.5
    assert (f >= 0.5 - 1e-6).all() and (f <= 1.5 + 1e-6).all()
    assert len(torch.unique(f)) == 32
    # one factor per sample: every pixel of a sample scaled alike
    assert torch.allclose(y, y[:, :1, :1, :1].expand_as(y))


def test_contrast_and_saturation_against_hand_values():
    x = torch.tensor([0.2, 0.6, 1.0]).view(1, 3, 1, 1).expand(1, 3, 2, 2).contiguous()
    gray = 0.2989 * 0.2 + 0.587 * 0.6 + 0.114 * 1.0
    sat0 = T.adjust_saturation(x, torch.tensor([0.0]))
    assert torch.allclose(sat0, torch.full_like(x, gray), atol=1e-6)
    con = T.adjust_contrast(x, torch.tensor([0.5]))
    assert torch.allclose(
        con[0, :, 0, 0], 0.5 * torch.tensor([0.2, 0.6, 1.0]) + 0.5 * gray, atol=1e-6
    )


def test_grayscale_p0_p1_and_single_channel():
    x = batch()
    assert torch.equal(T.RandomGrayscale(0.0)(x, gen()), x)
    y = T.RandomGrayscale(1.0)(x, gen())
    assert torch.equal(y[:, 0], y[:, 1]) and torch.equal(y[:, 1], y[:, 2])
    assert torch.allclose(y[:, :1], T.grayscale(x))
    g = batch(c=1)
    assert torch.equal(T.RandomGrayscale(1.0)(g, gen()), g)


def test_random_apply_p1_equals_transform_after_its_draw():
    x = batch()
    jit = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    a = T.RandomApply(jit, p=1.0)(x, gen(7))
    g = gen(7)
    torch.rand(8, generator=g)  # RandomApply's own coin flips
    assert torch.equal(a, jit(x, g))
    assert torch.equal(T.RandomApply(jit, p=0.0)(x, gen(7)), x)


def test_normalize_inverse_and_checks():
    x = batch()
    n = T.Normalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    y = n(x)
    assert torch.allclose(y[:, 1], (x[:, 1] - 0.5) / 0.25)
    assert torch.allclose(n.inverse(y), x, atol=1e-6)
    with pytest.raises(DataError, match="3 channel stats but the batch has 1"):
        n(batch(c=1))
    with pytest.raises(ConfigError, match="std must be > 0"):
        T.Normalize((0.0,), (0.0,))


def test_channel_stats_by_hand():
    imgs = torch.zeros(2, 2, 2, 2, dtype=torch.uint8)
    imgs[0, 0] = 255  # channel 0: half the pixels 1.0, half 0.0; channel 1: all 0
    mean, std = T.channel_stats(imgs)
    assert mean == pytest.approx((0.5, 0.0)) and std == pytest.approx((0.5, 0.0))
    with pytest.raises(DataError):
        T.channel_stats(torch.zeros(0, 3, 2, 2, dtype=torch.uint8))


@pytest.mark.parametrize("name", T.PIPELINES.names())
def test_named_pipelines(name):
    x = (torch.rand(6, 3, 16, 16, generator=gen()) * 255).to(torch.uint8)
    tf = T.build_transform(name, image_size=16, mean=(0.5,) * 3, std=(0.25,) * 3)
    y = tf(x, gen(1))
    assert y.shape == (6, 3, 16, 16) and y.dtype == torch.float32 and torch.isfinite(y).all()
    assert y.min() >= -2 - 1e-5 and y.max() <= 2 + 1e-5  # [0, 1] normalised by 0.5 / 0.25
    assert torch.equal(y, tf(x, gen(1)))


def test_pipeline_errors_and_defaults():
    with pytest.raises(ConfigError, match=r"valid: .*crop_flip"):
        T.build_transform("autoaugment", image_size=8, mean=(0.5,), std=(0.5,))
    with pytest.raises(ConfigError, match="needs image_size"):
        T.build_transform("simclr", image_size=None, mean=(0.5,), std=(0.5,))
    imgs = torch.full((4, 1, 8, 8), 51, dtype=torch.uint8)
    imgs[0] = 153
    train_tf, eval_tf = T.default_transforms(imgs)
    y = eval_tf(imgs)
    assert y.mean().item() == pytest.approx(0.0, abs=1e-5) and y.std(
        unbiased=False
    ).item() == pytest.approx(1.0, abs=1e-4)
    assert train_tf(imgs, gen()).shape == (4, 1, 8, 8)


def test_bad_batch_refused():
    with pytest.raises(DataError, match="B×C×H×W"):
        T.RandomHorizontalFlip()(torch.zeros(3, 4, 4))
    with pytest.raises(DataError, match="ToFloat first"):
        T.Normalize((0.5,), (0.5,))(torch.zeros(1, 1, 2, 2, dtype=torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_generator_drives_a_cuda_batch_like_a_cpu_batch():
    x = (torch.rand(8, 3, 16, 16, generator=gen()) * 255).to(torch.uint8)
    tf = T.build_transform("simclr", image_size=16, mean=(0.5,) * 3, std=(0.25,) * 3)
    on_cpu = tf(x, gen(2))
    on_gpu = tf(x.cuda(), gen(2))
    assert on_gpu.device.type == "cuda"
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-4)


@pytest.mark.parametrize("c", [3, 1])
def test_color_jitter_device_path_gives_the_cpu_bits(c):
    """Off the CPU ColorJitter selects with torch.where instead of nonzero()
    (no wait for the GPU); every op is per sample, so the bits are the same.
    Checked on the CPU through emulate_device_path, with all four ops enabled."""
    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1 if c == 3 else 0.0)
    x = batch(b=33, c=c, h=9, w=7)
    cpu = jitter(x, gen(5))
    with T.emulate_device_path():
        assert T.device_path("cpu")
        dev = jitter(x, gen(5))
    assert torch.equal(dev, cpu) and not T.device_path("cpu")


def _jitter_every_op_everywhere(jitter, x, g):
    """The device path before issue #50: every enabled op on the whole batch
    at every position, ``torch.where`` keeping it for its samples (16 op
    passes per call with all four enabled): the reference the fused path
    must equal bit for bit."""
    from osfl.data import colour

    u = colour._rand((x.shape[0], 8), g, x.device).to(x.dtype)
    factors = [lo + (hi - lo) * u[:, i] for i, (lo, hi) in enumerate(jitter._ranges())]
    values = (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
    enabled = [i for i, v in enumerate(values) if v > 0]
    order = torch.argsort(u[:, 4:], dim=1)
    for pos in range(4):
        for op in enabled:
            here = (order[:, pos] == op).view(-1, 1, 1, 1)
            x = torch.where(here, jitter._OPS[op](x, factors[op]), x)
    return x


@pytest.mark.parametrize(
    ("c", "values"),
    [(3, (0.4, 0.4, 0.4, 0.1)), (3, (0.8, 0.0, 0.0, 0.0)), (3, (0.0, 0.5, 0.9, 0.0)),
     (3, (0.0, 0.0, 0.0, 0.5)), (3, (2.0, 2.0, 2.0, 0.5)), (1, (0.4, 0.4, 0.4, 0.0))],
)  # fmt: skip
def test_color_jitter_fused_device_path_equals_every_op_everywhere(c, values):
    """Issue #50: the device path runs the three blends as one blend with
    per-sample factor and reference, and hue once, per position; the same
    bits as running every op at every position (large factors clamp)."""
    jitter = T.ColorJitter(*values)
    x = batch(b=65, c=c, h=7, w=9, seed=3)
    with T.emulate_device_path():
        fused = jitter(x, gen(11))
    assert torch.equal(fused, _jitter_every_op_everywhere(jitter, x, gen(11)))
    assert torch.equal(fused, jitter(x, gen(11)))  # and the CPU path's bits


def test_color_jitter_device_path_runs_each_op_once_per_position(monkeypatch):
    """8 op passes per call instead of 16 (hue once and one blend per
    position), and fewer batch-sized tensors written: counted with a
    dispatch mode over the whole call, in units of the batch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from osfl.data import colour

    class Written(TorchDispatchMode):
        total = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out._base is None:  # not a view
                self.total += out.numel() / x.numel()
            return out

    calls: list[str] = []
    hue = colour.adjust_hue

    def counted_hue(*a):
        calls.append("hue")
        return hue(*a)

    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    x = batch(b=64, c=3, h=16, w=16)
    with T.emulate_device_path():
        with Written() as old:
            reference = _jitter_every_op_everywhere(jitter, x, gen(2))
        monkeypatch.setattr(colour, "adjust_hue", counted_hue)
        monkeypatch.setattr(jitter, "_OPS", ())  # the blends must not call the ops
        with Written() as new:
            fused = jitter(x, gen(2))
    assert torch.equal(fused, reference) and calls == ["hue"] * 4
    assert new.total < 0.8 * old.total, (new.total, old.total)


def test_constants_are_made_once_per_device_and_dtype():
    """A fresh torch.tensor on a GPU is a blocking copy per batch: Normalize's
    mean/std and the luma weights are cached, with the same values."""
    x = batch()
    assert _const(_GRAY, x.dtype, x.device) is _const(_GRAY, x.dtype, x.device)
    g64 = T.grayscale(x.double())
    assert g64.dtype == torch.float64
    w = torch.tensor(_GRAY, dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.equal(g64, (x.double() * w).sum(1, keepdim=True))
    norm = T.Normalize([0.1, 0.2, 0.3], [0.5, 0.6, 0.7])
    assert torch.allclose(norm.inverse(norm(x)), x, atol=1e-6)
    # first made under inference_mode, the cached constants still serve autograd
    fresh = T.Normalize([0.11, 0.21, 0.31], [0.5, 0.6, 0.7])
    with torch.inference_mode():
        fresh(x)
    leaf = x.clone().requires_grad_(True)
    fresh(leaf).sum().backward()
    assert torch.allclose(leaf.grad[0, :, 0, 0], 1 / torch.tensor([0.5, 0.6, 0.7]))
