"""Linear probe of frozen encoders on a task disjoint from their upstream data.

The test of docs/pretrain.md and REPRODUCTION.md "Pretrained encoders (cpu
scale)": is an encoder made by ``osfl pretrain`` worth more, frozen, than the
same architecture at random initialisation? For every encoder file (with its
model card) and for random-init copies of each architecture, extract pooled
features of the task's images (no augmentation; normalised with the task's
own train statistics, as an ``osfl run`` would), fit a logistic-regression
probe (``osfl.pretrain.probe``: C picked on a validation split of the probe
train set) and report its test accuracy. Each card is checked against the
task with ``osfl.pretrain.check_disjoint`` first: an encoder that has seen the
task's classes is refused, not scored.

    python benchmarks/linear_probe.py pretrained/cifar5_sup.safetensors \\
        pretrained/cifar5_dino.safetensors --random-seeds 0,1,2 \\
        --task imagefolder:data/cifar10 --classes 5,6,7,8,9 \\
        --train-per-class 1000 --test-per-class 200 --json runs/linear_probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from osfl.data.transforms import build_transform, channel_stats
from osfl.models import create_model, load_pretrained
from osfl.pretrain import check_disjoint, pretrained_info
from osfl.pretrain.probe import extract_features, fit_linear_probe
from osfl.pretrain.upstream import cap_per_class, load_upstream, parse_classes


def probe(model: torch.nn.Module, task: Any, transform: Any) -> dict[str, float]:
    """Features of the task's train/test images -> fitted probe -> accuracies."""
    t0 = time.perf_counter()
    train_x = extract_features(model, task.train, transform)
    test_x = extract_features(model, task.held_out, transform)
    p = fit_linear_probe(train_x, task.train.labels.numpy(), task.train.num_classes)
    return {
        "test_accuracy": p.accuracy(test_x, task.held_out.labels.numpy()),
        "train_accuracy": p.accuracy(train_x, task.train.labels.numpy()),
        "val_accuracy": p.val_accuracy,
        "C": p.C,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def random_encoder(card: dict[str, Any], seed: int) -> torch.nn.Module:
    """The card's architecture at random initialisation (seeded)."""
    torch.manual_seed(seed)
    return create_model(card["model"]["name"], num_classes=10, **card["model"]["kwargs"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("encoders", nargs="+", help="weights files written by osfl pretrain")
    ap.add_argument("--task", default="imagefolder:data/cifar10")
    ap.add_argument("--classes", default="5,6,7,8,9", help="task classes (index or name)")
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--channels", type=int, default=None)
    ap.add_argument("--train-per-class", type=int, default=1000)
    ap.add_argument("--test-per-class", type=int, default=200)
    ap.add_argument("--random-seeds", default="0", help="seeds of the random-init baselines")
    ap.add_argument("--cache-dir", default=".osfl_cache")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    infos = [pretrained_info(p) for p in args.encoders]
    cards = [i["card"] for i in infos]
    if any(c is None for c in cards):
        ap.error("every encoder needs its model card (FILE.card.json), written by osfl pretrain")
    size = args.image_size or cards[0]["image_size"]
    task = load_upstream(
        args.task,
        parse_classes(args.classes),
        image_size=size,
        channels=args.channels,
        cache_dir=args.cache_dir,
    )
    task = dataclasses.replace(
        task,
        train=cap_per_class(task.train, args.train_per_class, seed=0),
        held_out=cap_per_class(task.held_out, args.test_per_class, seed=1),
    )
    present = list(task.classes)
    for info in infos:  # refuse an encoder that has seen the task's data
        check_disjoint(info["card"], args.task, present, task.train.fingerprint())
    mean, std = channel_stats(task.train)
    transform = build_transform("none", image_size=None, mean=mean, std=std)
    print(
        f"task {args.task} classes {present}: {len(task.train)} probe-train / "
        f"{len(task.held_out)} test images, {size} px",
        flush=True,
    )

    rows: list[dict[str, Any]] = []
    archs: dict[str, dict[str, Any]] = {}
    for info in infos:
        card = info["card"]
        arch = json.dumps([card["model"]["name"], card["model"]["kwargs"]], sort_keys=True)
        archs.setdefault(arch, card)
    for arch, card in archs.items():
        for seed in [int(s) for s in args.random_seeds.split(",") if s.strip()]:
            res = probe(random_encoder(card, seed), task, transform)
            rows.append({"encoder": f"random init (seed {seed})", "arch": arch, **res})
            print(rows[-1], flush=True)
    for path, info in zip(args.encoders, infos, strict=True):
        card = info["card"]
        model = random_encoder(card, 0)
        load_pretrained(model, path)
        res = probe(model, task, transform)
        up = card["upstream"]
        rows.append(
            {
                "encoder": path,
                "arch": json.dumps(
                    [card["model"]["name"], card["model"]["kwargs"]], sort_keys=True
                ),
                "objective": card["objective"]["name"],
                "upstream": f"{up['source']} {up['classes']}",
                "epochs": card["training"]["epochs"],
                "train_seconds": card["training"]["seconds"],
                "upstream_held_out": card["results"]["held_out"],
                "sha256": info["sha256"],
                **res,
            }
        )
        print(rows[-1], flush=True)

    print("\n| encoder | objective | epochs | probe test acc. (%) | C |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['encoder']} | {r.get('objective', '—')} | {r.get('epochs', '—')} | "
            f"{100 * r['test_accuracy']:.1f} | {r['C']} |"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"task": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
