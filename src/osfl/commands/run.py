"""``osfl run [CONFIG.yaml] [key=value ...] [--sweep key=v1,v2 ...] [--out DIR]``:
an experiment (no argument: the embedded default comparison)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osfl.commands.common import (
    get_console,
    name_from_file,
    print_scoreboards,
    process_seconds,
    progress_board,
    split_config_files,
    verbose_here,
)
from osfl.errors import ConfigError


def _check_sweep_spacing(sweeps: Sequence[str], items: Sequence[str]) -> None:
    """``--sweep partition.alpha=0.1, 1.0``: the shell splits at the space, so
    the sweep ends with a comma and ``1.0`` lands among the items, where it
    would be taken for a config file ("config file not found: 1.0"). Say
    what happened instead, with the command that works."""
    bare = [i for i in items if "=" not in i and not Path(i).is_file()]
    comma_led = [i for i in bare if i.startswith(",")]
    for s in sweeps:
        # a trailing comma alone is harmless (an empty value is dropped)
        if not bare or not (s.rstrip().endswith(",") or comma_led):
            continue
        rest = (comma_led or bare)[-1]
        fixed = f"{s.rstrip().rstrip(',')},{rest.lstrip(',')}"
        raise ConfigError(
            f"--sweep {s!r}: the shell split its values at a space; {rest!r} was taken for "
            f"a config file; write them without spaces (--sweep {fixed}) or quote the "
            "whole value"
        )


def _check_resume(args: argparse.Namespace, configs: list[str]) -> None:
    """``--resume DIR``: no other config, no ``--overwrite``, no other
    ``--out``, and a run directory that can go on."""
    if configs or args.overwrite:
        raise ConfigError(
            "--resume DIR re-runs DIR/config.yaml: give no other config file and no --overwrite"
        )
    if args.out is not None and Path(args.out) != Path(args.resume):
        raise ConfigError(f"--resume {args.resume} writes there; drop --out {args.out}")
    from osfl.rundir import resume_problem  # heavy: torch, as osfl.runner in cmd_run

    why = resume_problem(Path(args.resume))
    if why is not None:
        raise ConfigError(why)


def cmd_run(args: argparse.Namespace) -> int:
    # heavy: torch and the whole run stack (osfl.runner); `osfl --help` must not pay for it
    from osfl.runner import RunRequest, run

    _check_sweep_spacing(args.sweep or [], args.items)
    configs, overrides = split_config_files(args.items)
    config: str | list[str] | None = configs or None
    mode, out = "new", args.out
    if args.resume:
        _check_resume(args, configs)
        mode, out, config = "resume", args.resume, str(Path(args.resume) / "config.yaml")
    elif args.overwrite:
        mode = "overwrite"
    if mode != "resume":
        overrides = [*name_from_file(configs, overrides), *overrides]
    if args.no_progress:
        overrides.append("progress=false")
    console = get_console()
    req = RunRequest(
        config=config,
        overrides=overrides,
        sweeps=args.sweep or [],
        out=out,
        mode=mode,
        command=shlex.join(["osfl", *args.argv]),
    )
    outcome = run(
        req,
        lambda enabled: progress_board(console, enabled),
        announce=lambda text: console.print(f"[bold]{text}[/bold]"),
    )
    records = outcome.records
    print_scoreboards(console, records, f"{outcome.base.name} — {outcome.base.data.source}")
    if any("audit" in r for r in records):
        # heavy: torch (osfl.privacy)
        from osfl.privacy.audit import audit_rich_table

        table = audit_rich_table(records)
        if table is not None:
            console.print(table)
    # the wait as the user counts it, from the command's start (imports, data, plans)
    console.print(f"run directory: {outcome.out}  ({process_seconds():.1f} s)")
    return 0


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run an experiment (no argument: the embedded default)")
    run.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG.yaml | key=value",
        help="config files (composed in order: docs/design.md §5) and/or dotted overrides such as train.lr=0.01",
    )
    run.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2",
        help="grid over a key's values (repeatable); results are mean ± std over seeds",
    )
    run.add_argument("--out", help="run directory (default: runs/<timestamp>-<name>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier run in --out (default: refuse to touch it)",
    )
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="finish an interrupted run in DIR: same config, only its missing records run",
    )
    verbose_here(run)
    run.set_defaults(func=cmd_run)
