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

    python benchmarks/select_on_validation.py RUN_DIR [RUN_DIR ...] [--final RUN_DIR ...] [--per-seed OUT.json]

``--final`` names runs of further seeds made at the chosen settings (their
records' method and sweep point say which choice they belong to): the second
table then prints, per choice, the test accuracy of every seed at the last
round and at the round the run's own validation split chose
(``best_on_validation``: what a curve that jumps reports), mean ± sample std.
``--per-seed`` writes, per method (and grid point) and candidate, the
per-seed validation and test accuracies (%), which candidate was chosen and,
with ``--final``, the chosen setting's seeds.

Which accuracies: the server predictor's (``validation_accuracy``,
``global_test_accuracy``), or, for a method whose clients keep models of
their own (EFTViT, ``local``), the clients' own models' mean
(``mean_client_validation_accuracy``, ``mean_client_accuracy``: what their
papers evaluate), the same pair the record's ``best_on_validation`` chose on.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from osfl.record import RunRecord
from osfl.report import mean_std_text, read_metrics


def choice_key(record: RunRecord) -> str:
    """What one choice is made for: the method, and its sweep point if any
    (``fedavg``, ``fedavg @ partition.alpha=0.1``)."""
    return f"{record.method} @ {record.point}" if record.point else record.method


def accuracies(record: RunRecord) -> tuple[float | None, float | None]:
    """The validation and test accuracy a choice is made on and reports (see
    the module docstring): the clients' mean where the record has it."""
    clients = record.extra("mean_client_validation_accuracy")
    if record.mean_client_accuracy is not None and clients is not None:
        return clients, record.mean_client_accuracy
    return record.extra("validation_accuracy"), record.global_test_accuracy


def read_runs(run_dirs: list[str]) -> dict[str, list[dict]]:
    """Each run directory's records, by the directory's name (the candidate)."""
    return {Path(d).name: read_metrics(Path(d) / "metrics.json")["records"] for d in run_dirs}


def collect(runs: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """choice (method[ @ point]) -> candidate (run name) -> {"validation", "test"} -> seed -> %."""
    out: dict[str, dict[str, dict[str, dict[int, float]]]] = defaultdict(dict)
    for d, records in runs.items():
        for r in records:
            val, test = accuracies(r)
            if val is None:
                raise SystemExit(f"{d}: {r.method} has no validation_accuracy "
                                 "(run it with data.validation_fraction > 0)")  # fmt: skip
            cand = out[choice_key(r)].setdefault(d, {"validation": {}, "test": {}})
            seed = r.seed
            if seed in cand["test"]:
                raise SystemExit(f"{d}: two records of {choice_key(r)}, seed {seed}: a run "
                                 "directory must hold one candidate per choice")  # fmt: skip
            cand["validation"][seed] = round(100 * float(val), 4)
            cand["test"][seed] = round(100 * float(test or 0.0), 4)
    return out


def cell(values: dict[int, float]) -> str:
    return mean_std_text([values[s] for s in sorted(values)])


def seed_values(record: RunRecord) -> tuple[float, float | None, int | None]:
    """Test accuracy (%) at the last round, at the round chosen on validation
    (None without a curve) and that round (counted from 1)."""
    last = round(100 * float(accuracies(record)[1] or 0.0), 4)
    chosen = record.best_on_validation
    if not chosen:
        return last, None, None
    test = chosen.get("global_test_accuracy", chosen.get("mean_client_accuracy"))
    return last, round(100 * float(test), 4), int(chosen["round"]) + 1


def final_seeds(
    choices: dict[str, str], grid: dict[str, list[dict]], finals: dict[str, list[dict]]
) -> dict[str, dict[str, object]]:
    """choice -> the chosen candidate's seeds plus the final runs' seeds:
    ``accuracy`` and ``on_validation`` (seed -> %) and ``rounds`` (the rounds
    chosen on validation, in seed order)."""
    out: dict[str, dict[str, object]] = {}
    records = [(name, r) for runs in (grid, finals) for name, recs in runs.items() for r in recs]
    for name, r in records:
        key = choice_key(r)
        if key not in choices or (name != choices[key] and name not in finals):
            continue
        entry = out.setdefault(key, {"accuracy": {}, "on_validation": {}, "rounds": {}})
        seed = str(r.seed)
        if seed in entry["accuracy"]:
            raise SystemExit(f"{name}: seed {seed} of {key} twice (grid and final runs)")
        last, at_val, chosen_round = seed_values(r)
        entry["accuracy"][seed] = last
        if at_val is not None:
            entry["on_validation"][seed] = at_val
            entry["rounds"][seed] = chosen_round
    for entry in out.values():
        for k in ("accuracy", "on_validation", "rounds"):
            entry[k] = dict(sorted(entry[k].items(), key=lambda kv: int(kv[0])))
        entry["rounds"] = list(entry["rounds"].values())  # a list: not a group of accuracies
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument(
        "--final", nargs="*", default=[], help="runs of more seeds at the chosen settings"
    )
    ap.add_argument("--per-seed", help="write the per-seed values and the choices (JSON)")
    args = ap.parse_args(argv)
    grid = read_runs(args.run_dirs)
    table = collect(grid)
    print("| method | candidate (run) | validation (%) | test (%) | chosen |")
    print("|---|---|---:|---:|---|")
    dump = {}
    for method, cands in table.items():
        chosen = max(cands, key=lambda c: statistics.mean(cands[c]["validation"].values()))
        for name, acc in cands.items():
            mark = "**chosen**" if name == chosen else ""
            print(
                f"| {method} | {name} | {cell(acc['validation'])} | {cell(acc['test'])} | {mark} |"
            )
        dump[method] = {"chosen": chosen, "candidates": {
            n: {k: {str(s): v for s, v in sorted(a[k].items())} for k in a} for n, a in cands.items()
        }}  # fmt: skip
    if args.final:
        chosen = {k: v["chosen"] for k, v in dump.items()}
        finals = final_seeds(chosen, grid, read_runs(args.final))
        print(
            "\n| method | chosen | seeds | test, last round (%) | test, round chosen on validation (%) | rounds chosen |"
        )
        print("|---|---|---:|---:|---:|---|")
        for key, f in finals.items():
            acc, at_val = f["accuracy"], f["on_validation"]
            shown = mean_std_text(list(at_val.values())) if at_val else "–"
            rounds = " / ".join(str(n) for n in f["rounds"]) or "–"
            print(f"| {key} | {dump[key]['chosen']} | {len(acc)} | "
                  f"{mean_std_text(list(acc.values()))} | {shown} | {rounds} |")  # fmt: skip
            dump[key]["final"] = f
    if args.per_seed:
        Path(args.per_seed).write_text(json.dumps(dump, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
