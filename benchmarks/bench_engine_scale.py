"""Flower's simulation engine against the in-process runtime as the clients
grow: peak memory of the whole process tree and seconds per round.

Runs one ``osfl run`` command per runtime and client count (multi-round FedAvg,
McMahan et al., AISTATS 2017), samples the summed resident set (``VmRSS``) of
the command's process tree every 0.25 s (Ray's GCS, raylet and workers
included) and reads the round times from the record's ``curve`` (round 1
includes building the job; later rounds are the differences). Accuracies of
the two runtimes must be equal: same seed, one torch thread per client.

    python benchmarks/bench_engine_scale.py --clients 10 100          # digits
    python benchmarks/bench_engine_scale.py --clients 1000 \\
        --data imagefolder:$OSFL_CIFAR10 --max-per-class 2000         # 20,000 images

Needs the ``simulation`` extra (Ray) for ``flower_engine``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNTIMES = {
    "flower_engine": ["runtime=flower_engine"],
    "simulation": ["runtime=simulation", "parallel_clients=2", "threads_per_client=1"],
}


def tree_rss(pid: int) -> tuple[int, int]:
    """(summed VmRSS in bytes, process count) of ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, count, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    count += 1
        except OSError:
            continue
    return total, count


def measure(command: list[str]) -> dict[str, float]:
    """Run ``command``; its wall seconds, peak tree memory and process count."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak, procs = 0, 0
    while proc.poll() is None:
        rss, n = tree_rss(proc.pid)
        if rss > peak:
            peak, procs = rss, n
        time.sleep(0.25)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(command)}")
    return {"wall_s": time.perf_counter() - start, "peak_bytes": peak, "processes": procs}


def rounds_of(out: Path) -> tuple[list[float], float]:
    """Seconds of each round from the FedAvg record's curve, and its accuracy."""
    # heavy: torch (osfl.report), after the timed runs
    from osfl.report import read_metrics

    record = read_metrics(out / "metrics.json")["records"][0]
    seconds = [float(p.seconds or 0.0) for p in record.curve]
    per_round = [seconds[0], *(b - a for a, b in itertools.pairwise(seconds))]
    return per_round, 100 * float(record.global_test_accuracy or 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", default="digits")
    p.add_argument("--max-per-class", type=int, default=None)
    p.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES))
    args = p.parse_args()
    common = [
        "methods=[fedavg]", f"method.fedavg.rounds={args.rounds}", "partition.alpha=1.0",
        "partition.min_partition_size=2", "train.epochs=1", "eval_every=1", "cache_dir=null",
        f"data.source={args.data}", "--no-progress",
    ]  # fmt: skip
    if args.max_per_class:
        common += [
            f"data.max_per_class={args.max_per_class}",
            "data.options={test_max_per_class: 100}",
        ]
    print(
        "| clients | runtime | peak memory | processes | round 1 (s) | later rounds (s) | wall (s) | accuracy |"
    )
    print("|---:|---|---:|---:|---:|---|---:|---:|")
    for n in args.clients:
        for runtime in args.runtimes:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run"
                cmd = [sys.executable, "-m", "osfl", "run", *common,
                       f"partition.num_clients={n}", *RUNTIMES[runtime], "--out", str(out)]  # fmt: skip
                m = measure(cmd)
                per_round, acc = rounds_of(out)
            later = per_round[1:]
            print(
                f"| {n} | `{runtime}` | {m['peak_bytes'] / 2**30:.2f} GiB | {m['processes']} | "
                f"{per_round[0]:.1f} | {min(later):.2f}–{max(later):.2f} | {m['wall_s']:.0f} | "
                f"{acc:.2f} % |",
                flush=True,
            )


if __name__ == "__main__":
    main()
