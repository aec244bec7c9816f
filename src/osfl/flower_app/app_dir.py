"""The Flower app directory of osfl: what ``flwr run`` ships to a SuperLink.

A Flower app is a directory whose ``pyproject.toml`` names a ServerApp and a
ClientApp (``[tool.flwr.app.components]``) and declares the run config keys
with their defaults (``[tool.flwr.app.config]``). osfl's apps live in the
installed package (``osfl.flower_app.apps:server_app`` / ``:client_app``),
so the directory holds only that file; it is generated (``python -m
osfl.flower_app DIR``) rather than shipped so that it works from any install
and its defaults come from :class:`~osfl.fl.runtime.flower_job.JobSpec`, the
one place they are defined.

osfl (and torch) must be installed on the SuperLink's and every SuperNode's
machine: start them with ``--disable-runtime-dependency-installation`` (the
SuperLink) so that Flower does not try to ``uv sync`` the app's dependencies.
Reference: Flower app layout, https://flower.ai/docs/framework/ (``flwr
new``, ``flwr run``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from osfl import __version__
from osfl.errors import ConfigError
from osfl.flower.spec import JobSpec

#: The app's name on the SuperLink (``<publisher>/<name>``).
APP_NAME = "osfl-flower-app"
PUBLISHER = "osfl"
SERVER_APP = "osfl.flower_app.apps:server_app"
CLIENT_APP = "osfl.flower_app.apps:client_app"


def app_pyproject(spec: JobSpec | None = None) -> dict[str, Any]:
    """The app's ``pyproject.toml`` as a dict; ``spec`` sets the run-config
    defaults (each can still be overridden with ``flwr run -c``)."""
    return {
        "project": {
            "name": APP_NAME,
            "version": __version__,
            "description": "osfl methods over Flower (ServerApp + ClientApp of osfl.flower_app.apps)",
            "license": "Apache-2.0",
            "dependencies": [],  # osfl is installed on every machine (see the module docstring)
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": PUBLISHER,
                    "components": {"serverapp": SERVER_APP, "clientapp": CLIENT_APP},
                    "config": (spec or JobSpec()).to_run_config(),
                }
            }
        },
    }


def write_app(dest: str | Path, spec: JobSpec | None = None) -> Path:
    """Write the app directory ``dest`` (its ``pyproject.toml``); returns ``dest``."""
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(tomli_w.dumps(app_pyproject(spec)), encoding="utf-8")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m osfl.flower_app DIR [--experiment CFG] [--method M] [--seed S]
    [--out-dir D] [--override key=value ...]``: write the app directory."""
    p = argparse.ArgumentParser(
        prog="python -m osfl.flower_app",
        description="Write the osfl Flower app directory for `flwr run`.",
    )
    p.add_argument("dest", help="directory to write (created if missing)")
    p.add_argument(
        "--experiment",
        default="",
        help="osfl YAML config (absolute path); default: the embedded default",
    )
    p.add_argument("--method", default="", help="method to run; default: the config's first")
    p.add_argument("--seed", type=int, default=-1, help="seed; default: the config's first")
    p.add_argument("--out-dir", default="", help="run directory the ServerApp writes")
    p.add_argument(
        "--override", action="append", default=[], help="dotted config override (repeatable)"
    )
    args = p.parse_args(argv)
    # refused here, in one line, not when the SuperLink first runs the app
    if args.experiment and not Path(args.experiment).is_file():
        p.error(f"--experiment {args.experiment}: no such file")
    if args.method:
        import osfl.methods  # noqa: F401  # heavy: torch (registers the methods)
        from osfl.fl.method import METHODS  # heavy: torch

        try:
            METHODS.get(args.method)
        except ConfigError as e:
            p.error(f"--method: {e}")
    experiment = str(Path(args.experiment).resolve()) if args.experiment else ""
    out_dir = str(Path(args.out_dir).resolve()) if args.out_dir else ""
    spec = JobSpec(
        experiment=experiment,
        method=args.method,
        seed=None if args.seed < 0 else args.seed,
        overrides=tuple(args.override),
        out_dir=out_dir,
    )
    root = write_app(args.dest, spec)
    sys.stdout.write(f"wrote {root / 'pyproject.toml'}\n")
    return 0
