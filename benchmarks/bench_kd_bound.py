"""What bounds batching a KD teacher's K members on a CPU: the loop's
arithmetic rate against this core's dense matrix-product rate.

    python benchmarks/bench_kd_bound.py [--threads 1] [--repeats 5]

A KD server (DENSE, Co-Boosting, ADI, FedFTG, FedDF, FedMITR, FALCON's KD)
runs its K teachers on every synthetic batch: forward, then backward to the
input. Batching the K members into one forward (``torch.func.vmap``, or
grouped convolutions) removes per-call overhead but adds no arithmetic
units: it cannot run faster than the FLOPs at the best rate this core
reaches. This counts the FLOPs of the loop (``torch.utils.flop_counter``),
times it (min / median / max over ``--repeats``, after a warm-up), and
compares its rate with a large square matrix product's (the best case for
the core's vector units). ``peak / loop`` is the most any re-arrangement of
the same arithmetic could gain; below 1.5 the issue's 1.5× cannot be met on
this machine, whatever the batching.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from osfl.methods.kd.teacher import EnsembleTeacher
from osfl.models import create_model

MODELS = ("cnn_small", "resnet18", "vit_tiny_patch4_32")


def seconds(fn: Callable[[], None], repeats: int) -> list[float]:
    fn()  # warm-up: first-call allocations and kernel selection
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def teacher_step(teacher: EnsembleTeacher, x: torch.Tensor) -> Callable[[], None]:
    """What synthesis runs on the teacher each step: forward + backward to the input."""

    def step() -> None:
        xi = x.clone().requires_grad_(True)
        teacher(xi).square().sum().backward()

    return step


def flops(fn: Callable[[], None]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def matmul_rate(n: int, repeats: int) -> float:
    """FLOP/s of an n×n float32 matrix product (median of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / statistics.median(seconds(lambda: torch.mm(a, b), repeats))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    peak = max(matmul_rate(n, args.repeats) for n in (1024, 2048))
    print(f"dense matmul, float32, {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s\n")
    print("| model | K | GFLOP a step | loop s (min / median / max) | loop GFLOP/s | peak / loop |")
    print("|---|---:|---:|---|---:|---:|")
    for name in MODELS:
        for k in (5, 10):
            torch.manual_seed(0)
            teacher = EnsembleTeacher(
                [create_model(name, num_classes=10, img_size=32) for _ in range(k)]
            )
            step = teacher_step(teacher, torch.randn(args.batch, 3, 32, 32))
            work = flops(step)
            ts = seconds(step, args.repeats)
            rate = work / statistics.median(ts)
            print(
                f"| {name} | {k} | {work / 1e9:.2f} | {min(ts):.3f} / {statistics.median(ts):.3f} / "
                f"{max(ts):.3f} | {rate / 1e9:.1f} | {peak / rate:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
