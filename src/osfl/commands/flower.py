"""``osfl flower certs|run|status``: tools for Flower deployments
(docs/flower.md, docs/flower-security.md)."""

from __future__ import annotations

import argparse
from typing import Any

from osfl.commands.common import verbose_here
from osfl.errors import ConfigError


def cmd_flower_run(args: argparse.Namespace) -> int:
    # heavy: Flower's app tooling (osfl.flower_app.local)
    from osfl.flower_app.runs import flower_run

    return flower_run(args.app, args.superlink, list(args.flwr_args))


def cmd_flower_status(args: argparse.Namespace) -> int:
    # heavy: the run-directory readers
    from osfl.flower_app.runs import run_dir_status

    return run_dir_status(args.run_dir)


def _add_certs_arguments(certs: argparse.ArgumentParser) -> None:
    """``osfl flower certs``'s arguments, or, where ``cryptography`` is not
    installed (a lent GPU machine), a command that says so: every other
    command must still parse."""
    try:
        # heavy: cryptography (~40 ms): importing osfl.cli stays cheap, only the parser needs it
        from osfl.flower_app import certs as certs_tool
    except ImportError as e:
        missing = str(e)

        def unavailable(args: argparse.Namespace) -> int:
            raise ConfigError(f"osfl flower certs needs the cryptography package ({missing})")

        certs.add_argument("rest", nargs=argparse.REMAINDER)
        certs.set_defaults(func=unavailable)
        return
    certs_tool.add_arguments(certs)
    verbose_here(certs)
    certs.set_defaults(func=certs_tool.run)


def add_parser(sub: Any) -> None:
    flower = sub.add_parser("flower", help="tools for Flower deployments (docs/flower.md)")
    fsub = flower.add_subparsers(dest="flower_command", required=True)
    certs = fsub.add_parser(
        "certs",
        help="make a throwaway CA, server certificate and SuperNode keys for a TLS rehearsal "
        "(docs/flower-security.md)",
    )
    _add_certs_arguments(certs)
    frun = fsub.add_parser(
        "run",
        help="flwr run --stream, then exit 0 when the Flower run completed, 1 when it failed",
        description="Runs `flwr run APP SUPERLINK [flwr run options] --stream` and exits with "
        "the run's final status (flwr ls): 0 completed, 1 failed, 2 not started.",
    )
    frun.add_argument("app", help="the osfl app directory (python -m osfl.flower_app DIR)")
    frun.add_argument("superlink", help="the SuperLink connection (a name in flwr's config.toml)")
    frun.add_argument("flwr_args", nargs=argparse.REMAINDER, help="more `flwr run` options")
    verbose_here(frun)
    frun.set_defaults(func=cmd_flower_run)
    status = fsub.add_parser(
        "status",
        help="exit 0 when RUN_DIR holds a finished run, 1 when it failed or stopped",
    )
    status.add_argument("run_dir", metavar="RUN_DIR", help="a run directory the ServerApp wrote")
    verbose_here(status)
    status.set_defaults(func=cmd_flower_status)
