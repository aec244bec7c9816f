"""``osfl eval RUN_DIR [--data SPEC [--all]] [--method NAME] [--device DEV]``:
score the final server models a run kept again, without training
(docs/run-directory.md, "Kept models"), so that an accuracy in
``metrics.json`` can be checked, or measured on other data.

Exit status (as ``cmp`` and ``diff`` use it): 0 when every model scored on
the run's own test images equals its card and its record, 1 when one
differs (each difference is named), 2 when a file is refused."""

from __future__ import annotations

import argparse
from typing import Any

from osfl.commands.common import get_console, verbose_here


def _percent(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def cmd_eval(args: argparse.Namespace) -> int:
    """Score every kept model of ``RUN_DIR``, print one row per model, and
    return 1 when one differs from its card or its run's record."""
    # heavy: rich, torch (osfl.kept_model builds the run's tasks)
    from rich.table import Table

    from osfl.kept_model import evaluate_run  # heavy: torch (the assembly layer)

    rows = evaluate_run(
        args.run_dir, args.data, method=args.method, device=args.device, everything=args.all
    )
    on = args.data or "the run's test split"
    table = Table()
    points = any(r.point for r in rows)
    for col in ("method", "seed", *(["grid point"] if points else [])):
        table.add_column(col)
    for col in ("card accuracy (%)", "metrics.json (%)", "accuracy now (%)", "test images"):
        table.add_column(col, justify="right")
    table.add_column("equal", justify="right")
    for r in rows:
        samples = "—" if r.test_samples is None else str(r.test_samples)
        cells = [r.method, str(r.seed), *([r.point] if points else [])]
        accuracies = (r.card_accuracy, r.record_accuracy, r.accuracy)
        table.add_row(*cells, *map(_percent, accuracies), samples, _verdict(r))
    console = get_console()
    console.print(f"kept models of {args.run_dir}, scored on {on}", highlight=False)
    console.print(table)
    for line in _notes(rows, args.data):
        console.print(line, highlight=False, markup=False)
    differ = [r for r in rows if r.problems]
    for r in differ:
        at = f" at {r.point}" if r.point else ""
        console.print(
            f"{r.method} seed {r.seed}{at} differs: {'; '.join(r.problems)}",
            highlight=False,
            markup=False,
        )
    return 1 if differ else 0


def _verdict(r: Any) -> str:
    """The ``equal`` cell: a note, ``other data`` (nothing to compare), yes or no."""
    if r.note:
        return str(r.note)
    if r.problems:
        return "no"
    return "yes" if r.compared else "other data"


def _notes(rows: list[Any], data: str | None) -> list[str]:
    """Why an accuracy may differ from its card's: other data, another CPU
    kernel path, a config that resolves differently today."""
    scored = [r for r in rows if r.accuracy is not None]
    notes = list(dict.fromkeys(r.data_note for r in rows if r.data_note))
    if data is not None:
        notes.append(f"scored on {data}: the cards' accuracies are on the run's own test split")
    if any(not r.same_cpu for r in scored):
        notes.append(
            "another CPU kernel path than the run's (cpu_fingerprint differs): accuracies "
            "may differ in the last digits"
        )
    if any(not r.same_config for r in scored):
        notes.append(
            "the run's config.yaml resolves differently with this osfl (config_sha256 "
            "differs from the card's): new defaults may change the task"
        )
    return notes


def add_parser(sub: Any) -> None:
    ev = sub.add_parser("eval", help="score a run's kept final models again, without training")
    ev.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `osfl run`")
    ev.add_argument(
        "--data",
        metavar="SPEC",
        help="score on this data spec's test split instead (digits, imagefolder:<dir>, ...; "
        "the run's image size, channels and class names); a folder holding only test/ is "
        "scored in full",
    )
    ev.add_argument(
        "--all",
        action="store_true",
        help="with --data: score every image of SPEC (its train and test parts), not only "
        "its test split",
    )
    ev.add_argument("--method", help="only this method's models")
    ev.add_argument("--device", help="device to score on (default: the run config's)")
    verbose_here(ev)
    ev.set_defaults(func=cmd_eval)
