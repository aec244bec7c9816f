"""What every ``osfl`` command shares: the one console it prints through, the
live progress board, logging, ``-v`` after the command, the run and table
scoreboards, and the one-line handling of a user error (:func:`dispatch`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, OsflError
from osfl.fl.progress import Progress, RichProgress
from osfl.interrupts import INTERRUPTED, sigint_policy

VERBOSE_HELP = (
    "more log output: -v shows each client's training and each method's result "
    "(INFO), -vv debug messages; the run directory's run.log always has INFO"
)


def verbose_here(sub: argparse.ArgumentParser) -> None:
    """``-v`` after the command too (``osfl run -v``); counted with any before it."""
    sub.add_argument(
        "-v", "--verbose", dest="verbose_after", action="count", default=0, help=VERBOSE_HELP
    )


def split_config_files(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """``[CONFIG.yaml ...] key=value ...``: the config files (every item
    without ``=``, in the order given: they compose, docs/design.md §5) and the
    overrides."""
    configs = [item for item in items if "=" not in item]
    return configs, [item for item in items if "=" in item]


def name_from_file(configs: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``name="<stem>"`` for a run of the user's own config files when none of
    them (nor their ``base:`` files, nor an override) sets ``name``: the run
    directory and the tables are then named after the file, not after the
    packaged default they layer on ("default")."""
    if not configs or any(o.split("=", 1)[0].strip() == "name" for o in overrides):
        return []
    # heavy: omegaconf (the config layers)
    from osfl.config import config_layers_of

    packaged = config_layers_of(None)[0][1]
    if any("name" in node for node, source in config_layers_of(configs) if source != packaged):
        return []
    return [f"name={json.dumps(Path(configs[-1]).stem)}"]


def split_run_args(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] key=value ...`` for a command that takes one config file."""
    configs, overrides = split_config_files(items)
    if len(configs) > 1:
        raise ConfigError(
            f"two config files given ({configs[0]!r}, {configs[1]!r}); pass one, then "
            "key=value overrides"
        )
    return (configs[0] if configs else None), overrides


#: When this module was imported (the first thing ``osfl`` does): the start
#: time where the kernel does not say when the process started.
_IMPORTED = time.perf_counter()


def process_seconds() -> float:
    """Seconds since this process started: imports, data loading and planning
    included, as a user waiting for the command counts them (Linux: the
    kernel's start time of the process; elsewhere since osfl's CLI loaded)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _IMPORTED


#: The console of the running command (:func:`new_console` makes it; logging writes through it).
_CONSOLE: Any = None
#: Piped output is this wide: no table is wrapped or cut (rich would assume 80 columns).
PIPED_WIDTH = 1000


def get_console() -> Any:
    """The console every command prints through, and logging too in a terminal
    (so that log lines go above the live progress bars instead of onto them).
    Piped to a file or another program: no colour codes, and wide enough that
    no table is wrapped or cut."""
    global _CONSOLE
    if _CONSOLE is None:
        _CONSOLE = make_console()
    return _CONSOLE


def new_console() -> Any:
    """A fresh console for the command about to run (``osfl.cli.main``)."""
    global _CONSOLE
    _CONSOLE = make_console()
    return _CONSOLE


def make_console() -> Any:
    # heavy: rich (~25 ms, as much as the rest of the CLI; `osfl --help` needs none of it)
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH, color_system=None)


def progress_board(console: Any, enabled: bool) -> Any:
    """One live progress display for the whole run when the output is a
    terminal (bars of local training, rounds and server phases stack on it);
    the silent board otherwise or with ``--no-progress``."""
    return RichProgress(console) if enabled and console.is_terminal else Progress()


def print_scoreboards(console: Any, records: Sequence[Any], title: str) -> None:
    """One table per regime (numbers of different regimes are never ranked
    together), then the warnings."""
    # heavy: torch (osfl.report)
    from osfl import report

    rows = report.summarize(records)
    groups = report.by_regime(rows)
    for regime, group in groups.items():
        heading = f"{title}\n{report.regime_heading(regime)}" if len(groups) > 1 else title
        console.print(report.rich_table(group, title=heading))
    for line in report.warning_lines(rows):
        console.print(f"[yellow]warning[/yellow] {line}", markup=True, highlight=False)


class _PlainHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Log lines as plain text on stderr (output that is not a terminal)."""


def setup_logging(verbose: int, console: Any) -> None:
    """One handler on the ``osfl`` logger: in a terminal rich's, writing through
    ``console`` (the one the live progress display draws on, so a log line is
    printed above the bars, never onto one); otherwise plain lines on stderr,
    without colour codes or wrapping."""
    # heavy: rich (~25 ms; `osfl --help` exits before logging is set up)
    from rich.logging import RichHandler

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logger = logging.getLogger("osfl")
    for old in [h for h in logger.handlers if isinstance(h, RichHandler | _PlainHandler)]:
        logger.removeHandler(old)
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=False, show_time=False)
    else:
        handler = _PlainHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(level)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command: a user error (any :class:`~osfl.errors.OsflError`,
    or an ``OSError`` on a path the user gave) prints one line ``osfl: error:
    ...`` and exits with its status (2); Ctrl-C exits with 130, a second one
    at once (:mod:`osfl.interrupts`: no write is cut, no thread waited for)."""
    try:
        with sigint_policy():
            return int(args.func(args))
    except (OsflError, OSError) as e:  # OSError: a path the user gave cannot be read/written
        print(f"osfl: error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_status if isinstance(e, OsflError) else 2) from None
    except KeyboardInterrupt:
        print("osfl: interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
