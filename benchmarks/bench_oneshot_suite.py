"""The one-shot suite in one command against each method in its own process.

``osfl run configs/oneshot_suite_digits_vit.yaml`` runs nine one-shot methods
on the same clients: the model-upload methods share one client training
through the content-keyed client cache, and one process loads the data once.
The alternative a user of the papers' public code has is one script per
method, each training its own clients. This times both, sequentially, in
fresh processes (so neither gains from the other's page cache or warm
imports beyond what a user would have), with the cache off for the
per-method runs and a fresh, empty cache for the suite.

    python benchmarks/bench_oneshot_suite.py                     # the whole suite
    python benchmarks/bench_oneshot_suite.py --methods fedavg ensemble adi
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from osfl.report import read_metrics

CONFIG = "configs/oneshot_suite_digits_vit.yaml"


def timed_run(overrides: list[str], out: Path) -> tuple[float, dict[str, float]]:
    """Wall time of one ``osfl run`` process and each method's accuracy."""
    osfl = [sys.executable, "-c", "import sys; from osfl.cli import main; sys.exit(main())"]
    cmd = [*osfl, "run", CONFIG, *overrides, "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--no-progress"], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    records = read_metrics(out / "metrics.json")["records"]
    return wall, {r.method: r.ranked_accuracy for r in records}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--methods", nargs="+", default=None, help="default: the config's")
    args = ap.parse_args()
    from osfl.config import load_config

    methods = args.methods or list(load_config(CONFIG, []).methods)
    listed = f"methods=[{','.join(methods)}]"
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {CONFIG}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        suite, suite_acc = timed_run([listed, f"cache_dir={root / 'cache'}"], root / "suite")
        alone: dict[str, float] = {}
        alone_acc: dict[str, float] = {}
        for m in methods:
            alone[m], acc = timed_run([f"methods=[{m}]", "cache_dir=null"], root / m)
            alone_acc.update(acc)
    print("| method | own process, no cache (s) | accuracy alone / in the suite (%) |")
    print("|---|---:|---:|")
    for m in methods:
        print(f"| {m} | {alone[m]:.1f} | {100 * alone_acc[m]:.2f} / {100 * suite_acc[m]:.2f} |")
    total = sum(alone.values())
    print(f"| **sum of separate runs** | **{total:.1f}** | |")
    print(f"| **one suite command** | **{suite:.1f}** | |")
    print(f"\nsuite speed-up: {total / suite:.2f}x")


if __name__ == "__main__":
    main()
