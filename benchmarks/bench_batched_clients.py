"""Batched vs sequential client training (``batch_clients``, osfl.fl.batched_training).

N clients of one architecture train one local epoch each from the same
weights, once one after another (``train_local`` per client, what the
simulation does by default) and once as one batched step per iteration
(``train_batched``), in the same process, side by side, so the ratio is
robust to machine noise. Images/s counts every client's images.

    python benchmarks/bench_batched_clients.py                      # defaults below
    python benchmarks/bench_batched_clients.py --models lenet5 --clients 50 --px 32 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
import platform
import time

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.batched_training import train_batched
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.models import create_model


def client_sets(n: int, samples: int, px: int) -> list[ImageSet]:
    g = torch.Generator().manual_seed(0)
    return [
        ImageSet(
            torch.randint(0, 256, (samples, 3, px, px), dtype=torch.uint8, generator=g),
            torch.randint(0, 10, (samples,), generator=g),
            classes=[str(c) for c in range(10)],
        )
        for _ in range(n)
    ]


def run(name: str, n: int, px: int, samples: int, cfg: TrainConfig) -> tuple[float, float]:
    """(sequential, batched) images/s for ``n`` clients."""
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, in_chans=3, img_size=px)
    datas = client_sets(n, samples, px)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    train_batched(model, datas[:2], dataclasses.replace(cfg, steps=2), gens[:2])  # warm
    t0 = time.perf_counter()
    for i, data in enumerate(datas):
        train_local(copy.deepcopy(model), data, cfg, generator=torch.Generator().manual_seed(i))
    seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_batched(model, datas, cfg, [torch.Generator().manual_seed(i) for i in range(n)])
    bat = time.perf_counter() - t0
    images = n * samples * cfg.epochs
    return images / seq, images / bat


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["lenet5", "cnn_small"])
    ap.add_argument("--clients", nargs="+", type=int, default=[5, 10, 50, 100])
    ap.add_argument("--px", nargs="+", type=int, default=[16, 32])
    ap.add_argument("--samples", type=int, default=128, help="per client")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("osfl").setLevel(logging.ERROR)  # random labels: "did not learn" is expected
    cfg = TrainConfig(optimizer="sgdm", lr=0.01, epochs=args.epochs, batch_size=args.batch_size)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"threads={torch.get_num_threads()}, {args.samples} samples/client, batch "
        f"{args.batch_size}, {args.epochs} epochs, load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print("| model | px | clients | sequential img/s | batched img/s | batched / sequential |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        for px in args.px:
            for n in args.clients:
                seq, bat = run(name, n, px, args.samples, cfg)
                print(
                    f"| {name} | {px} | {n} | {seq:,.0f} | {bat:,.0f} | {bat / seq:.2f}× |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
