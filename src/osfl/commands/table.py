"""``osfl table RUN_DIR ...``: one scoreboard per regime from several run
directories on the same clients."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from osfl.commands.common import get_console, print_scoreboards, verbose_here
from osfl.errors import ConfigError


def cmd_table(args: argparse.Namespace) -> int:
    """``osfl table RUN_DIR ...``: one scoreboard per regime from several runs on
    the same clients (refused when their clients differ)."""
    # heavy: torch (osfl.report, osfl.scoreboard)
    from osfl import report
    from osfl.scoreboard import merge_runs  # heavy: torch, as above

    # the output files are checked before anything is read or printed: a refusal writes nothing
    for flag, name in (("--per-seed", args.per_seed), ("--frontier", args.frontier)):
        _check_output_file(flag, name, overwrite=args.overwrite)
    records = merge_runs(args.run_dirs, allow_unkeyed=args.allow_unkeyed)
    frontier = report.frontier_figure(records) if args.frontier else None
    if args.frontier and frontier is None:
        raise ConfigError("--frontier needs records of at least two methods")
    if args.markdown:
        rows = report.summarize(records)
        print(report.summary_markdown(rows, title=" + ".join(args.run_dirs)))
    else:
        print_scoreboards(get_console(), records, " + ".join(args.run_dirs))
    if args.per_seed:
        Path(args.per_seed).write_text(json.dumps(report.per_seed(records), indent=1) + "\n")
        print(f"per-seed values: {args.per_seed}")
    if frontier is not None:
        frontier.savefig(args.frontier)
        print(f"frontier plot: {args.frontier}")
    return 0


def _check_output_file(flag: str, name: str | None, *, overwrite: bool) -> None:
    """``flag NAME`` names a file this command may write: not a directory, in
    a folder that exists, and not an existing file unless ``--overwrite``."""
    if name is None:
        return
    path = Path(name)
    if path.is_dir():
        raise ConfigError(f"{flag} {name} is a directory; give a file name")
    if path.exists() and not overwrite:
        raise ConfigError(f"{flag} {name} exists; pass --overwrite to replace it")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {name}: folder {path.parent} does not exist")


def add_parser(sub: Any) -> None:
    tab = sub.add_parser(
        "table", help="one scoreboard per regime from several run directories on the same clients"
    )
    tab.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to merge")
    tab.add_argument("--markdown", action="store_true", help="print GitHub Markdown tables")
    tab.add_argument("--frontier", metavar="PNG", help="also plot accuracy against total bytes")
    tab.add_argument(
        "--per-seed",
        metavar="JSON",
        help="also write each row's per-seed accuracies (REPRODUCTION's reproduction/*.json)",
    )
    tab.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --per-seed or --frontier file (default: refuse)",
    )
    tab.add_argument(
        "--allow-unkeyed",
        action="store_true",
        help="take records without a split key (older runs) on trust",
    )
    verbose_here(tab)
    tab.set_defaults(func=cmd_table)
