"""EFTViT: the server's predictor against each client's own model.

EFTViT (§3) keeps every client's local module private; the server's predictor
is its trained global module on top of the *pretrained* local module, while
the global module is trained on features of the clients' drifting local
modules. This script runs EFTViT in the simulation and scores, on the same test
set, the server's predictor and every client's own model (its local module +
the same global module, ``EFTViT.client_predictor``).

    python benchmarks/eftvit_client_models.py [--config configs/eftvit_cifar10_cpu.yaml]
        [--rounds 30] [overrides ...]

Example (REPRODUCTION.md, EFTViT): ``python benchmarks/eftvit_client_models.py
"data.classes=[dog,frog,horse,ship,truck]" partition.num_clients=10
partition.min_partition_size=5 method.eftvit.client_fraction=0.4 partition.alpha=0.1``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.fl.evaluate import evaluate
from osfl.fl.runtime.simulation import SimulationRuntime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/eftvit_cifar10_cpu.yaml")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(
        args.config,
        [
            *args.overrides,
            "methods=[eftvit]",
            "sweep=[]",
            "eval_every=0",
            f"method.eftvit.rounds={args.rounds}",
        ],
    )
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), cfg.seeds[0])
    job = assembly.build_job(cfg, "eftvit", ctx)
    result = SimulationRuntime().execute(job)
    test, run = ctx.splits.test, ctx.run
    print(f"server predictor: {100 * result.metrics['global_test_accuracy']:.1f} %")
    own = []
    for c, state in sorted(result.client_states.items()):
        acc = evaluate(
            job.method.client_predictor(result.state, state), test, run.eval_transform, run.device
        ).accuracy
        own.append(100 * acc)
        print(f"client {c}: {own[-1]:.1f} %")
    print(
        f"clients' own models: mean {statistics.mean(own):.1f} %, "
        f"range {min(own):.1f}-{max(own):.1f} %"
    )


if __name__ == "__main__":
    main()
