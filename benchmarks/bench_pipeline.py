"""Images/s of the batch pipeline: ``BatchIterator`` + batched augmentation on
the training device, against a ``torch.utils.data.DataLoader`` over PIL images
with the same per-sample augmentations written with PIL/numpy (the classic
torchvision-style input pipeline, without torchvision).

Augmentation in both: pad-4 random crop, horizontal flip, colour jitter
(0.4, 0.4, 0.4, 0.1; random op order per sample), normalise. Same images (a
CIFAR-10 subset read by the image-folder loader from ``--cifar10`` or
``$OSFL_CIFAR10`` (README), else scikit-learn digits at 32 px), same batch
size, same machine.

    OSFL_CIFAR10=/path/to/cifar10 python benchmarks/bench_pipeline.py [--per-class 500]
        [--batch-size 256] [--epochs 2] [--threads 1] [--profile]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image, ImageEnhance
from torch.utils.data import DataLoader, Dataset

from osfl.data import BatchIterator, channel_stats, load_data
from osfl.data import transforms as T


class PILAugmented(Dataset):
    """Per-sample PIL/numpy augmentation, as torchvision's PIL path does it."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std, seed: int = 0):
        hwc = images.permute(0, 2, 3, 1).numpy()
        mode = "RGB" if hwc.shape[-1] == 3 else "L"
        self.pil = [Image.fromarray(a if mode == "RGB" else a[..., 0], mode) for a in hwc]
        self.labels = labels.tolist()
        self.mean = np.asarray(mean, np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(std, np.float32).reshape(-1, 1, 1)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.pil)

    def _hue(self, im: Image.Image, shift: float) -> Image.Image:
        h, s, v = im.convert("HSV").split()
        hh = (np.asarray(h, np.uint8).astype(np.int16) + int(shift * 255)).astype(np.uint8)
        return Image.merge("HSV", (Image.fromarray(hh, "L"), s, v)).convert("RGB")

    def __getitem__(self, i: int):
        r = self.rng
        im = self.pil[i]
        w, h = im.size
        # pad 4 and crop back at a random offset
        a = np.pad(
            np.asarray(im), ((4, 4), (4, 4), (0, 0)) if im.mode == "RGB" else ((4, 4), (4, 4))
        )
        t, left = r.randint(0, 8), r.randint(0, 8)
        im = Image.fromarray(np.ascontiguousarray(a[t : t + h, left : left + w]), im.mode)
        if r.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        ops = [
            lambda x: ImageEnhance.Brightness(x).enhance(r.uniform(0.6, 1.4)),
            lambda x: ImageEnhance.Contrast(x).enhance(r.uniform(0.6, 1.4)),
            lambda x: ImageEnhance.Color(x).enhance(r.uniform(0.6, 1.4)),
            lambda x: self._hue(x, r.uniform(-0.1, 0.1)),
        ]
        r.shuffle(ops)
        for op in ops:
            im = op(im)
        x = np.asarray(im, np.float32) / 255.0
        x = x.transpose(2, 0, 1) if x.ndim == 3 else x[None]
        return torch.from_numpy((x - self.mean) / self.std), self.labels[i]


def time_epochs(make_iter, epochs: int) -> float:
    """Images/s over ``epochs`` full passes (after one warm-up batch)."""
    it = make_iter()
    next(iter(it))
    n, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _y in it:
            n += x.shape[0]
    return n / (time.perf_counter() - start)


def profile(tf: T.Compose, batches: Callable[[], object]) -> str:
    """Seconds per epoch in each step of the batched pipeline: batching, each
    transform, and inside the colour jitter each of its four ops (timed by
    wrapping them; the jitter's own bookkeeping is its total minus its ops)."""
    spent: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Callable) -> Callable:
        def call(*a):
            t = time.perf_counter()
            out = fn(*a)
            spent[name] += time.perf_counter() - t
            return out

        return call

    ops = T.ColorJitter._OPS
    T.ColorJitter._OPS = tuple(timed(f"  jitter: {op.__name__}", op) for op in ops)
    steps = [(type(t).__name__, timed(type(t).__name__, t)) for t in tf.transforms]
    gen = torch.Generator().manual_seed(0)
    try:
        t = time.perf_counter()
        for x, _y in batches():
            spent["batching (BatchIterator)"] += time.perf_counter() - t
            for _name, step in steps:
                x = step(x, gen)
            t = time.perf_counter()
    finally:
        T.ColorJitter._OPS = ops
    total = sum(v for k, v in spent.items() if not k.startswith("  "))
    lines = ["\n| step (one epoch) | seconds | share of the epoch |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.3f} | {100 * v / total:.0f} % |" for k, v in spent.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-class", type=int, default=500, help="CIFAR-10 train images per class")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cache-dir", default=None, help="decoded-image cache for the CIFAR subset")
    ap.add_argument("--cifar10", default=os.environ.get("OSFL_CIFAR10"),
                    help="CIFAR-10 image folder (default $OSFL_CIFAR10; none: digits)")  # fmt: skip
    ap.add_argument("--profile", action="store_true",
                    help="also time each step of the batched pipeline (and each jitter op)")  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads of the batched pipeline (DataLoader workers use 1 each)",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.cifar10:
        src = f"CIFAR-10 subset ({args.per_class}/class) from {args.cifar10}"
        splits = load_data(
            f"imagefolder:{args.cifar10}",
            max_per_class=args.per_class,
            test_max_per_class=1,
            cache_dir=args.cache_dir,
        )
    else:
        src = "digits at 32 px, RGB (no --cifar10 / $OSFL_CIFAR10)"
        splits = load_data("digits", image_size=32, channels=3)
    train = splits.train
    mean, std = channel_stats(train)
    print(f"data: {src}: {tuple(train.images.shape)}; batch {args.batch_size}; "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip

    tf = T.Compose(
        [
            T.ToFloat(),
            T.RandomCrop(train.image_shape[1], padding=4),
            T.RandomHorizontalFlip(),
            T.ColorJitter(0.4, 0.4, 0.4, 0.1),
            T.Normalize(mean, std),
        ]
    )
    gen = torch.Generator().manual_seed(0)

    class Batched:
        def __iter__(self):
            for x, y in BatchIterator.from_imageset(train, args.batch_size, generator=gen):
                yield tf(x, gen), y

    rows = [("BatchIterator + batched transforms", "-", time_epochs(Batched, args.epochs))]
    ds = PILAugmented(train.images, train.labels, mean, std)
    for workers in (0, 2):

        def make(workers=workers):
            return DataLoader(
                ds, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                persistent_workers=workers > 0,
            )  # fmt: skip

        rows.append(
            ("DataLoader + PIL/numpy per sample", str(workers), time_epochs(make, args.epochs))
        )

    if args.profile:
        print(
            profile(tf, lambda: BatchIterator.from_imageset(train, args.batch_size, generator=gen))
        )
    ours = rows[0][2]
    print("\n| pipeline | workers | images/s | batched / this |\n|---|---|---:|---:|")
    for name, w, ips in rows:
        print(f"| {name} | {w} | {ips:,.0f} | {ours / ips:.1f}x |")


if __name__ == "__main__":
    main()
