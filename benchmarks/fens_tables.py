"""REPRODUCTION's FENS rows from run directories: mean ± sample std over seeds
per (run, method and FENS variant, α), with the bytes of one run, and every
per-seed accuracy written to a JSON file (the repository keeps them under
``reproduction/``). A FENS record is labelled by the options where it differs
from the method's defaults (``fens``, ``fens[holdout=0.0]``, ...).

    python benchmarks/fens_tables.py RUN_DIR [RUN_DIR ...] --out FILE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from osfl.methods.fens import FENSConfig
from osfl.record import RunRecord, plain
from osfl.report import read_metrics


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


DEFAULTS = _flat(dataclasses.asdict(FENSConfig()))


def label(record: RunRecord) -> str:
    """The method, and for FENS the options that differ from its defaults."""
    if record.method != "fens":
        return record.method
    given = _flat(plain(record.method_config or {}))  # the JSON values, lists as lists
    diff = [f"{k}={v}" for k, v in sorted(given.items()) if DEFAULTS.get(k) != v]
    return "fens" + (f"[{', '.join(diff)}]" if diff else "")


def collect(run_dirs: list[str]) -> tuple[dict[str, dict[int, float]], dict[str, int]]:
    """``run|label|point`` -> seed -> accuracy (%), and the same key -> bytes up +
    down (``run``: the run directory's name, so that two tasks never mix)."""
    acc: dict[str, dict[int, float]] = defaultdict(dict)
    sent: dict[str, int] = {}
    for d in run_dirs:
        for r in read_metrics(Path(d) / "metrics.json")["records"]:
            key = f"{Path(d).name}|{label(r)}|{r.point}"
            acc[key][r.seed] = round(100 * float(r.ranked_accuracy or 0.0), 4)
            sent[key] = int(r.bytes_up or 0) + int(r.bytes_down or 0)
    return acc, sent


def cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--out", help="write the per-seed accuracies (JSON) here")
    args = ap.parse_args(argv)
    acc, sent = collect(args.run_dirs)
    print("| run | method | point | bytes up + down | accuracy (%) | seeds |")
    print("|---|---|---|---:|---:|---:|")
    for key in sorted(acc):
        run, name, point = key.split("|", 2)
        seeds = acc[key]
        values = [seeds[s] for s in sorted(seeds)]
        mib = sent[key] / 2**20
        print(f"| {run} | {name} | {point} | {mib:.2f} MiB | {cell(values)} | {len(values)} |")
    if args.out:
        per_seed = {k: {str(s): v for s, v in sorted(acc[k].items())} for k in sorted(acc)}
        Path(args.out).write_text(json.dumps(per_seed, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
