"""Local training step throughput of the registered models on this machine.

One step = forward + cross-entropy + backward + SGD(momentum) update on random
images, which is what a client's local training spends its time on. The
numbers calibrate the ``cpu`` scale (docs/design.md §6): how many images an epoch
of local training on a 2-core machine can afford.

    python benchmarks/bench_train_step.py                       # defaults below
    python benchmarks/bench_train_step.py --models resnet18 --batch-sizes 64 --threads 2
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from torch import nn

from osfl.models import create_model

# (model, image size, extra kwargs)
DEFAULT_MODELS: dict[str, tuple[int, dict]] = {
    "cnn_small": (32, {}),
    "lenet5": (32, {}),
    "resnet18": (32, {}),
    "vit_tiny_patch4_32": (32, {}),
}


def bench(
    name: str, size: int, kwargs: dict, batch: int, steps: int, warmup: int, device: str
) -> dict:
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, **kwargs).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    times = []
    for i in range(warmup + steps):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {
        "model": name,
        "px": size,
        "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "batch": batch,
        "ms_step": med * 1e3,
        "img_s": batch / med,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"device={args.device}, threads={torch.get_num_threads()}, steps={args.steps} (median), "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"| {'model':<20} | {'px':>3} | {'params (M)':>10} | {'batch':>5} | {'ms/step':>9} | {'img/s':>8} |"
    )
    print(f"|{'-' * 22}|{'-' * 5}|{'-' * 12}|{'-' * 7}|{'-' * 11}|{'-' * 10}|")
    for name in args.models:
        size, kw = DEFAULT_MODELS.get(name, (32, {}))
        for b in args.batch_sizes:
            r = bench(name, size, kw, b, args.steps, args.warmup, args.device)
            print(
                f"| {r['model']:<20} | {r['px']:>3} | {r['params_M']:>10.3f} | {r['batch']:>5} "
                f"| {r['ms_step']:>9.1f} | {r['img_s']:>8.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
