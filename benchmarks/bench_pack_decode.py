"""The image pack's size, decode time and GPU-resize pixel difference (issue #40).

A lent GPU job pays for every second before its first step, so this measures
what the suite's data costs there, on any machine with the CIFAR-10 image
folder (docs/gpu-suite.md, "Before: pack what the machine needs"):

- the pack's size against the files' (shared prefixes stored once);
- decoding from the pack in memory: all of CIFAR-10, and one step's five
  classes (``classes`` option), with one worker and with every core;
- the pixel difference between Pillow's bilinear resize (the cpu path) and
  torch's antialiased bilinear (the op the GPU path runs, here on the CPU)
  for a 32 -> ``--size`` upsample: max and mean absolute difference.

    python benchmarks/bench_pack_decode.py --cifar10 /path/to/cifar10 [--repeats 3]

Timings are the best of ``--repeats`` (other processes share the cores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from osfl.data import load_data
from osfl.data.sources.common import resize_images
from osfl.suite.pack import pack_imagefolder


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """The fastest of ``repeats`` runs of ``fn`` in seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cifar10", default=os.environ.get("OSFL_CIFAR10", "data/cifar10"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=224, help="the upsample's side in pixels")
    ap.add_argument("--resize-images", type=int, default=2000, help="test images compared")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        pack_file = Path(tmp) / "cifar10.npz"
        t0 = time.perf_counter()
        entry = pack_imagefolder(args.cifar10, pack_file)
        print(
            f"pack: {sum(entry['images'].values())} files, {entry['file_bytes'] / 2**20:.2f} MiB "
            f"of files -> {entry['bytes'] / 2**20:.2f} MiB pack ({time.perf_counter() - t0:.1f} s)"
        )
        spec = f"imagefolder:{pack_file}"
        five = ["5", "6", "7", "8", "9"]
        for label, opts in [
            ("all 60,000 images, 1 worker", {"num_workers": 1}),
            (f"all 60,000 images, {cores} workers", {}),
            ("5 classes (30,000 images), 1 worker", {"num_workers": 1, "classes": five}),
            (f"5 classes (30,000 images), {cores} workers", {"classes": five}),
        ]:
            s = best_of(args.repeats, lambda o=opts: load_data(spec, **o))
            print(f"decode from the pack in memory, {label}: {s:.2f} s")
        s = best_of(args.repeats, lambda: load_data(f"imagefolder:{args.cifar10}"))
        print(f"decode from the files (image folder, min(8, cores) workers): {s:.2f} s")

        # Pillow's upsample (today's path) against torch's op on the same images
        n = args.resize_images
        opts = {"image_size": args.size, "test_max_per_class": n // 10, "max_per_class": 1}
        t0 = time.perf_counter()
        pil = load_data(spec, resize="pillow", **opts).test.images
        t_pil = time.perf_counter() - t0
        t0 = time.perf_counter()
        tch = load_data(spec, resize="torch", **opts).test.images
        t_tch = time.perf_counter() - t0
        native = load_data(spec, test_max_per_class=n // 10, max_per_class=1).test.images
        assert torch.equal(tch, resize_images(native, args.size))
        diff = (pil.int() - tch.int()).abs()
        hist = np.bincount(diff.flatten().numpy(), minlength=3)
        print(
            f"32 -> {args.size} px, {len(pil)} test images: Pillow {t_pil:.2f} s, torch (cpu) "
            f"{t_tch:.2f} s; |Pillow - torch| max {int(diff.max())}, mean {diff.float().mean():.4f} "
            f"grey levels; {hist[0] / diff.numel():.2%} of values equal, "
            f"{hist[1] / diff.numel():.2%} differ by 1"
        )


if __name__ == "__main__":
    main()
