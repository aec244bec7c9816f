"""REPRODUCTION's EFTViT rows from its run directories: both predictors.

Every EFTViT record holds the mean of the clients' own models (its
``mean_client_accuracy``, each client in ``client_accuracies``) and the
server's predictor (``global_test_accuracy``), at the end and, with
``eval_every``, per round (``curve``). This prints, per run directory and
grid point (client learning rate × Dirichlet β), the final accuracy of both,
each one's best round on the test set (optimistic: it is chosen by looking
at test scores), the round a validation split chooses (runs with
``data.validation_fraction > 0``: the record's ``best_on_validation``, the
clients' mean) with its test accuracy, and the first round each reaches a
target, and writes
every per-seed value to a JSON file (the repository keeps it under
``reproduction/``).

    python benchmarks/eftvit_tables.py RUN_DIR ... [--target 0.1=0.4 --target 1.0=0.55] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.record import CurvePoint, RunRecord
from osfl.report import read_metrics


def first_reaching(curve: Sequence[CurvePoint], key: str, target: float) -> int | None:
    """The first evaluated round (counted from 1) whose ``key`` reaches ``target``."""
    return next(
        (p.round + 1 for p in curve if (getattr(p, key) or -1.0) >= target),
        None,
    )


def best(curve: Sequence[CurvePoint], key: str) -> tuple[float, int] | None:
    """The highest ``key`` of the curve (%) and its round (counted from 1)."""
    points = [p for p in curve if getattr(p, key) is not None]
    if not points:
        return None
    top = max(points, key=lambda p: getattr(p, key))
    return round(100 * float(getattr(top, key)), 2), top.round + 1


def on_validation(record: RunRecord) -> tuple[int, float, float] | None:
    """The round the validation split chooses (counted from 1), its validation
    and its test accuracy (%), or None for a run without a validation split
    (an EFTViT record's: the clients' mean; the server predictor's only for
    a record without clients' numbers)."""
    chosen = record.best_on_validation
    if not chosen:
        return None
    val, test = (
        ("mean_client_validation_accuracy", "mean_client_accuracy")
        if "mean_client_validation_accuracy" in chosen
        else ("validation_accuracy", "global_test_accuracy")
    )
    return (
        int(chosen["round"]) + 1,
        round(100 * float(chosen[val]), 2),
        round(100 * float(chosen[test]), 2),
    )


def row(record: RunRecord, targets: Mapping[float, float]) -> dict[str, Any]:
    """The values of one EFTViT record (accuracies in %)."""
    alpha = float((record.partition or {})["params"]["alpha"])
    curve = record.curve
    clients = record.extra("client_accuracies", [])
    out: dict[str, Any] = {
        "lr": float((record.train or {})["lr"]),
        "alpha": alpha,
        "seed": record.seed,
        "clients_mean": round(100 * float(record.mean_client_accuracy or 0.0), 2),
        "server": round(100 * float(record.global_test_accuracy or 0.0), 2),
        "clients": [None if a is None else round(100 * a, 2) for a in clients],
        "clients_not_sampled": record.extra("clients_not_sampled", []),
        "best_clients_mean": best(curve, "mean_client_accuracy"),
        "best_server": best(curve, "global_test_accuracy"),
        "on_validation": on_validation(record),
        "rounds": int(record.rounds or 0),
    }
    if alpha in targets:
        target = targets[alpha]
        out["target"] = target
        out["rounds_to_target_clients_mean"] = first_reaching(curve, "mean_client_accuracy", target)
        out["rounds_to_target_server"] = first_reaching(curve, "global_test_accuracy", target)
    return out


def collect(run_dirs: Sequence[str], targets: Mapping[float, float]) -> list[dict[str, Any]]:
    """Every EFTViT record of the run directories, by β, client lr and seed."""
    rows = []
    for d in run_dirs:
        for r in read_metrics(Path(d) / "metrics.json")["records"]:
            if r.method == "eftvit":
                rows.append({"run": Path(d).name, **row(r, targets)})
    return sorted(rows, key=lambda x: (x["alpha"], x["lr"], x["run"], x["seed"]))


def _best_cell(value: tuple[float, int] | None) -> str:
    return "–" if value is None else f"{value[0]:.1f} ({value[1]})"


def _validation_cell(value: Sequence[float] | None) -> str:
    return "–" if not value else f"{int(value[0])}: {value[2]:.1f}"


def _target_cell(r: Mapping[str, Any]) -> str:
    """Rounds to the target, clients' mean / server ("–": not reached, blank: no target)."""
    if "target" not in r:
        return ""
    rounds = [r["rounds_to_target_clients_mean"], r["rounds_to_target_server"]]
    return f"{100 * r['target']:g} %: " + " / ".join("–" if n is None else str(n) for n in rounds)


def markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table's lines: one per record (run directory, β, client lr, seed)."""
    lines = [
        "| run | β | client lr | seed | clients' mean | server | best clients' mean (round) "
        "| best server (round) | chosen on validation: round, clients' mean | clients' range "
        "| rounds to target (clients' mean / server) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        own = [a for a in r["clients"] if a is not None]
        spread = f"{min(own):.1f}–{max(own):.1f}" if own else "–"
        lines.append(
            f"| {r.get('run', '')} | {r['alpha']} | {r['lr']:g} | {r['seed']} | {r['clients_mean']:.1f} "
            f"| {r['server']:.1f} | {_best_cell(r['best_clients_mean'])} "
            f"| {_best_cell(r['best_server'])} | {_validation_cell(r.get('on_validation'))} "
            f"| {spread} | {_target_cell(r)} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--target", action="append", default=[], help="ALPHA=ACCURACY (a fraction)")
    ap.add_argument("--out", help="write the per-seed values here (JSON)")
    args = ap.parse_args()
    targets = {float(a): float(t) for a, t in (x.split("=") for x in args.target)}
    rows = collect(args.run_dirs, targets)
    print("\n".join(markdown(rows)))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
