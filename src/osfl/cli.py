"""The ``osfl`` command line (docs/design.md §5).

    osfl run                                  # the embedded default comparison
    osfl run CONFIG.yaml [key=value ...] [--sweep key=v1,v2 ...] [--out DIR]
    osfl config show CONFIG.yaml [key=value ...]   # the resolved config, no run
    osfl partition --dataset digits --scheme dirichlet --alpha 0.1 --clients 5 --seed 0 --out p.json
    osfl list
    osfl eval RUN_DIR [--data SPEC] [--method NAME]   # score the kept models again
    osfl data get cifar10                     # download, check the MD5, print the data.source

Each command group lives in its own module of :mod:`osfl.commands` (its
``cmd_*`` functions and its ``add_parser``); this module only puts the
parser together and runs the command.

A user error (unknown name, bad value, missing file: any
:class:`~osfl.errors.OsflError`) prints one line ``osfl: error: ...`` and
exits with status 2, like argparse's own usage errors; anything else is a bug
and keeps its traceback. Ctrl-C exits with 130: the first once the clients
already training finish, a second at once (:mod:`osfl.interrupts`). Methods
of other installed packages (``osfl.methods`` entry points) are found by every
command that reads the method registry (docs/adding-a-method.md).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from osfl import __version__
from osfl.commands import (
    audit,
    config,
    data,
    flower,
    listing,
    partition,
    pretrain,
    run,
    suite,
    table,
)
from osfl.commands import eval as eval_command  # not the builtin's name here
from osfl.commands.common import VERBOSE_HELP, dispatch, new_console, setup_logging

log = logging.getLogger("osfl.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osfl", description="Federated learning of image classifiers."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"osfl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub)
    config.add_parser(sub)
    partition.add_parser(sub)
    listing.add_parser(sub)
    data.add_parser(sub)
    table.add_parser(sub)
    audit.add_parser(sub)
    eval_command.add_parser(sub)
    pretrain.add_parser(sub)
    suite.add_parser(sub, main)  # a suite step runs its command through main itself
    flower.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``osfl`` script; user errors exit with status 2."""
    parser = build_parser()
    # ``osfl run CONFIG --out DIR key=value``: overrides may follow options.
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for the records
    if extra and getattr(args, "suite_command", None) == "mfu":
        args.rest, extra = [*extra, *args.rest], []  # the benchmark parses its own options
    if extra:
        if args.command != "run" or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.items = [*args.items, *extra]
    console = new_console()
    setup_logging(args.verbose + getattr(args, "verbose_after", 0), console)
    return dispatch(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
