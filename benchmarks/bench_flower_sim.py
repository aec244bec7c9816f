"""Our simulation runtime vs Flower's own simulation engine on the same job.

Multi-round FedAvg (McMahan et al., AISTATS 2017), 10 clients, 20 rounds, the
small CNN (``cnn_small``) on scikit-learn's digits (16 px), one local epoch a
round. Three carriers of the same Method objects:

- ``osfl simulation``: ``osfl.fl.runtime.simulation`` (``runtime=simulation``),
  clients in a thread pool of ``--parallel`` workers, one torch thread each;
- ``osfl flower loopback``: the osfl ServerApp/ClientApp in this process
  (``runtime=flower``: Flower messages + wire encoding, no transport);
- ``Flower simulation engine``: ``flwr.simulation.run_simulation`` with the
  same apps (Ray backend, ``--parallel`` actors of one CPU each; every actor
  builds the job from the config, as a SuperNode does).

Wall time is the whole call (Ray start-up included for Flower); repeats are
interleaved so that machine load hits every carrier alike. Accuracies must be
equal (same seed, one torch thread per client everywhere).

    python benchmarks/bench_flower_sim.py [--rounds 20] [--clients 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

EXPERIMENT = """
name: bench-flower-sim
data: {source: digits, image_size: 16}
partition: {scheme: dirichlet, alpha: 0.5, min_partition_size: 10}
model: {name: cnn_small}
train: {epochs: 1, batch_size: 32, optimizer: sgdm, lr: 0.05, momentum: 0.9}
methods: [fedavg]
seeds: [0]
device: cpu
cache_dir: null
progress: false
"""


def overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"partition.num_clients={args.clients}",
        f"method.fedavg.rounds={args.rounds}",
        f"parallel_clients={args.parallel}",
    ]


def run_osfl(args: argparse.Namespace, runtime: str) -> tuple[float, dict[str, Any]]:
    from osfl.config import load_config
    from osfl.experiment import run_experiment

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(EXPERIMENT)
    try:
        cfg = load_config(f.name, [*overrides(args), f"runtime={runtime}"])
    finally:
        Path(f.name).unlink()
    t0 = time.perf_counter()
    (record,) = run_experiment(cfg)
    return time.perf_counter() - t0, record


def run_flower_engine(args: argparse.Namespace, out: Path) -> tuple[float, dict[str, Any]]:
    from osfl.assembly import job_from_spec
    from osfl.config import load_config_text
    from osfl.experiment import run_experiment
    from osfl.flower.engine import FlowerEngineRuntime
    from osfl.flower.spec import JobSpec

    spec = JobSpec(experiment=EXPERIMENT, overrides=tuple(overrides(args)), out_dir=str(out))
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": args.parallel, "num_gpus": 0},
    }
    runtime = FlowerEngineRuntime(job_from_spec, spec, backend_config=backend)
    cfg = load_config_text(EXPERIMENT, list(spec.overrides))
    t0 = time.perf_counter()
    (record,) = run_experiment(cfg, runtime=runtime)
    return time.perf_counter() - t0, record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--parallel", type=int, default=2, help="clients at once (threads / Ray actors)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.parallel)  # the thread pool splits it: one per client
    carriers = ["osfl simulation", "osfl flower loopback"]
    have_ray = importlib.util.find_spec("ray") is not None
    if have_ray:
        carriers.append("Flower simulation engine")
    else:
        print(
            "ray is not installed: skipping Flower's simulation engine "
            "(pip install 'flwr[simulation]')",
            file=sys.stderr,
        )
    times: dict[str, list[float]] = {c: [] for c in carriers}
    loop: dict[str, list[float]] = {c: [] for c in carriers}
    acc: dict[str, set[float]] = {c: set() for c in carriers}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for c in carriers:
                if c == "Flower simulation engine":
                    wall, rec = run_flower_engine(args, Path(tmp) / f"flower-{rep}")
                else:
                    wall, rec = run_osfl(args, "simulation" if c == "osfl simulation" else "flower")
                times[c].append(wall)
                loop[c].append(rec.total_seconds)
                acc[c].add(round(rec.global_test_accuracy, 6))
                print(
                    f"  rep {rep} {c}: {wall:.1f} s, accuracy {rec.global_test_accuracy:.4f}",
                    file=sys.stderr,
                )
    base = statistics.median(times["osfl simulation"])
    print(
        f"\nFedAvg, {args.clients} clients, {args.rounds} rounds, cnn_small, digits 16 px, "
        f"{args.parallel} clients at once, {args.repeats} interleaved repeats (median)"
    )
    print(f"{'carrier':<26} {'wall s':>8} {'rounds s':>9} {'vs ours':>8} {'accuracy':>9}")
    for c in carriers:
        wall = statistics.median(times[c])
        accs = ", ".join(f"{a:.4f}" for a in sorted(acc[c]))
        print(
            f"{c:<26} {wall:>8.1f} {statistics.median(loop[c]):>9.1f} "
            f"{wall / base:>7.2f}x {accs:>9}"
        )
    same = len(set().union(*acc.values())) == 1
    print(f"accuracies equal across carriers: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
