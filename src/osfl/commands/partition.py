"""``osfl partition --dataset digits --scheme dirichlet --alpha 0.1 --clients 5
--seed 0 --out p.json``: split a dataset among clients and save the federation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from osfl.commands.common import get_console, verbose_here
from osfl.errors import ConfigError


def cmd_partition(args: argparse.Namespace) -> int:
    # heavy: rich, torch (osfl.data)
    from rich.table import Table

    from osfl.data.partition import make_federation  # heavy: torch
    from osfl.data.sources import load_data  # heavy: torch

    for flag, name in (("--out", args.out), ("--plot", args.plot)):
        if name is not None and Path(name).is_dir():  # before anything is written
            raise ConfigError(f"{flag} {name} is a directory; give a file name")
    params: dict[str, Any] = {}
    if args.alpha is not None:
        params["alpha"] = args.alpha
    if args.classes_per_client is not None:
        params["classes_per_client"] = args.classes_per_client
    if args.min_partition_size is not None:
        params["min_partition_size"] = args.min_partition_size
    train = load_data(args.dataset).train
    fed = make_federation(
        train.labels,
        args.scheme,
        args.clients,
        args.seed,
        domains=train.domains,
        num_classes=train.num_classes,
        **params,
    )
    path = fed.save_json(args.out)
    table = Table(title=f"{fed.scheme} {dict(fed.params)} seed {fed.seed}")
    for col in ("client", "samples", "classes", "largest class share"):
        table.add_column(col, justify="right")
    for c, counts in enumerate(fed.class_counts):
        n = int(counts.sum())
        share = f"{counts.max() / n:.2f}" if n else "—"
        table.add_row(str(c), str(n), str(int((counts > 0).sum())), share)
    console = get_console()
    console.print(table)
    console.print(f"federation written to {path}")
    if args.plot:
        # heavy: matplotlib
        from osfl.data.plot import plot_class_counts

        console.print(
            f"heat map written to {plot_class_counts(fed, args.plot, class_names=list(train.classes))}"
        )
    return 0


def add_parser(sub: Any) -> None:
    part = sub.add_parser("partition", help="split a dataset among clients and save the federation")
    part.add_argument(
        "--dataset", required=True, help="data spec, e.g. digits or imagefolder:<dir>"
    )
    part.add_argument("--scheme", required=True, help="partition scheme (see `osfl list`)")
    group = part.add_mutually_exclusive_group()
    group.add_argument("--alpha", type=float, help="Dirichlet concentration (dirichlet)")
    group.add_argument("--classes-per-client", type=int, help="classes per client (pathological)")
    part.add_argument(
        "--min-partition-size",
        type=int,
        help="smallest client size (dirichlet; default: the scheme's, 2 — the embedded "
        "default experiment of `osfl run` sets 10)",
    )
    part.add_argument("--clients", type=int, required=True, help="number of clients")
    part.add_argument("--seed", type=int, default=0)
    part.add_argument("--out", required=True, help="output JSON file")
    part.add_argument("--plot", help="also write the class-count heat map to this PNG")
    verbose_here(part)
    part.set_defaults(func=cmd_partition)
