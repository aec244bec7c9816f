"""Choose each method's setting on the validation split, then report its test
accuracy: the selection REPRODUCTION's rules ask for (never on the test set,
the same number of candidates per method).

Each run directory holds one candidate setting of the methods it ran (its
name says which); every record must carry ``validation_accuracy`` (runs with
``data.validation_fraction > 0``). For each method, the candidate with the
highest mean validation accuracy over seeds is chosen (the first of equals,
in the order given), and the table prints every candidate's validation and
test accuracy (mean ± sample std over seeds) with the chosen one marked. A
run with a ``--sweep`` (its records' ``point``, e.g. Dirichlet α) is a
separate choice per grid point: a setting is chosen for each point on its
own validation split, never pooled across points.

    python benchmarks/select_on_validation.py RUN_DIR [RUN_DIR ...] [--per-seed OUT.json]

``--per-seed`` writes, per method (and grid point) and candidate, the
per-seed validation and test accuracies (%) and which candidate was chosen.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from osfl.report import mean_std_text, read_metrics


def choice_key(record: dict) -> str:
    """What one choice is made for: the method, and its sweep point if any
    (``fedavg``, ``fedavg @ partition.alpha=0.1``)."""
    point = record.get("point") or ""
    return f"{record['method']} @ {point}" if point else record["method"]


def collect(run_dirs: list[str]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """choice (method[ @ point]) -> candidate (run name) -> {"validation", "test"} -> seed -> %."""
    out: dict[str, dict[str, dict[str, dict[int, float]]]] = defaultdict(dict)
    for d in run_dirs:
        for r in read_metrics(Path(d) / "metrics.json")["records"]:
            if r.get("validation_accuracy") is None:
                raise SystemExit(f"{d}: {r['method']} has no validation_accuracy "
                                 "(run it with data.validation_fraction > 0)")  # fmt: skip
            cand = out[choice_key(r)].setdefault(Path(d).name, {"validation": {}, "test": {}})
            seed = int(r["seed"])
            if seed in cand["test"]:
                raise SystemExit(f"{d}: two records of {choice_key(r)}, seed {seed}: a run "
                                 "directory must hold one candidate per choice")  # fmt: skip
            cand["validation"][seed] = round(100 * float(r["validation_accuracy"]), 4)
            cand["test"][seed] = round(100 * float(r["global_test_accuracy"]), 4)
    return out


def cell(values: dict[int, float]) -> str:
    return mean_std_text([values[s] for s in sorted(values)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--per-seed", help="write the per-seed values and the choices (JSON)")
    args = ap.parse_args(argv)
    table = collect(args.run_dirs)
    print("| method | candidate (run) | validation (%) | test (%) | chosen |")
    print("|---|---|---:|---:|---|")
    dump = {}
    for method, cands in table.items():
        chosen = max(cands, key=lambda c: statistics.mean(cands[c]["validation"].values()))
        for name, acc in cands.items():
            mark = "**chosen**" if name == chosen else ""
            print(f"| {method} | {name} | {cell(acc['validation'])} | {cell(acc['test'])} | {mark} |")
        dump[method] = {"chosen": chosen, "candidates": {
            n: {k: {str(s): v for s, v in sorted(a[k].items())} for k in a} for n, a in cands.items()
        }}  # fmt: skip
    if args.per_seed:
        Path(args.per_seed).write_text(json.dumps(dump, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
