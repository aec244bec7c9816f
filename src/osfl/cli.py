"""The ``osfl`` command line (DESIGN.md §5).

    osfl run                                  # the embedded default comparison
    osfl run CONFIG.yaml [key=value ...] [--sweep key=v1,v2 ...] [--out DIR]
    osfl partition --dataset digits --scheme dirichlet --alpha 0.1 --clients 5 --seed 0 --out p.json
    osfl list

A user error (unknown name, bad value, missing file: any
:class:`~osfl.errors.OsflError`) prints one line ``osfl: error: ...`` and
exits with status 2, like argparse's own usage errors; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, OsflError

log = logging.getLogger("osfl.cli")


# --------------------------------------------------------------------------- run
def _split_run_args(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] key=value ...``: the config is the one item without ``=``."""
    config = None
    overrides = []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise ConfigError(
                f"two config files given ({config!r}, {item!r}); pass one, then key=value overrides"
            )
    return config, overrides


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from osfl import report
    from osfl.assembly import check_names, method_names
    from osfl.config import expand_sweeps, load_config, merge_sweeps, to_dict, to_yaml
    from osfl.experiment import run_experiment
    from osfl.rundir import RunDir

    console = Console()
    config, overrides = _split_run_args(args.items)
    if args.no_progress:
        overrides.append("progress=false")
    base = load_config(config, overrides)
    sweeps = merge_sweeps(base.sweep, args.sweep or [])
    points = expand_sweeps(sweeps)
    cfgs = [
        (p, load_config(config, [*overrides, *(f"{k}={v}" for k, v in p.items())])) for p in points
    ]
    for _, c in cfgs:  # every grid point is validated before anything runs
        check_names(c)
    base = dataclasses.replace(base, methods=method_names(base), sweep=sweeps)
    out = Path(args.out or base.out_dir or RunDir.default_path(base.name))
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    with RunDir(out) as rd, _progress_board(console, base.progress) as board:
        header = f"# osfl run {' '.join(args.items)}".rstrip() + "\n"
        rd.write_text("config.yaml", header + to_yaml(base))
        rd.event("run_start", config=config or "embedded default", points=len(points))
        for point, cfg in cfgs:
            label = " ".join(f"{k}={v}" for k, v in point.items())
            if label:
                console.print(f"[bold]{label}[/bold]")
            records += run_experiment(cfg, rundir=rd, point=point, progress=board)
        wall = time.perf_counter() - t0
        rows = report.summarize(records)
        info = {
            "config": to_dict(base),
            "sweep": sweeps,
            "wall_time_s": round(wall, 3),
        }
        report.write_metrics(rd.path / "metrics.json", records, info=info)
        notes = [
            f"data `{base.data.source}`, {base.partition.num_clients} clients, "
            f"partition `{base.partition.scheme}`, model `{base.model.name}`, scale `{base.scale}`",
            f"seeds {sorted({r['seed'] for r in records})}; wall time {wall:.1f} s",
        ]
        summary = report.summary_markdown(rows, title=f"osfl run: {base.name}", notes=notes)
        audited = any("audit" in r for r in records)
        if audited:  # privacy audits (audit=[rlu, ...]): their own table
            from osfl.privacy.audit import audit_markdown

            summary = summary.rstrip() + "\n\n" + audit_markdown(records)
        rd.write_text("summary.md", summary)
        report.plot_curves(records, rd.path / "curves.png")
        rd.event("run_end", wall_time_s=round(wall, 3), records=len(records))
    console.print(report.rich_table(rows, title=f"{base.name} — {base.data.source}"))
    if audited:
        from osfl.privacy.audit import audit_rich_table

        table = audit_rich_table(records)
        if table is not None:
            console.print(table)
    console.print(f"run directory: {out}  ({wall:.1f} s)")
    return 0


def _progress_board(console: Any, enabled: bool) -> Any:
    """One live progress display for the whole run when the output is a
    terminal (bars of local training, rounds and server phases stack on it);
    the silent board otherwise or with ``--no-progress``."""
    from contextlib import nullcontext

    from osfl.fl.progress import Progress, RichProgress

    if enabled and console.is_terminal:
        return RichProgress(console)
    return nullcontext(Progress())


# --------------------------------------------------------------------------- audit
def cmd_audit(args: argparse.Namespace) -> int:
    """``osfl audit RUN_DIR --attack rlu ...``: score attacks on a run's recorded
    Observations (docs/privacy.md, "Auditing a run")."""
    from omegaconf import OmegaConf
    from rich.console import Console

    from osfl.audit_dir import audit_run_dir
    from osfl.privacy.audit import audit_rich_table, parse_audit

    options: dict[str, dict[str, Any]] = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        attack, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ConfigError(
                f"--option {item!r} must look like ATTACK.KEY=VALUE (rlu.num_samples=1000)"
            )
        options.setdefault(attack.lower(), {})[name] = OmegaConf.from_dotlist([f"v={value}"])["v"]
    items: list[Any] = [{"attack": a, **options.pop(a.lower(), {})} for a in args.attack]
    if options:
        raise ConfigError(f"--option names attack(s) not given with --attack: {', '.join(options)}")
    spec = parse_audit(items)
    assert spec is not None  # argparse requires at least one --attack
    results = audit_run_dir(
        args.run_dir,
        spec.attacks,
        aux_per_class=args.aux_per_class,
        aux_seed=args.aux_seed,
        device=args.device,
    )
    console = Console()
    table = audit_rich_table(results, title=f"privacy audit — {args.run_dir}")
    if table is not None:
        console.print(table)
    console.print(f"results written to {Path(args.run_dir) / 'audit.json'} and metrics.json")
    return 0


# --------------------------------------------------------------------------- partition
def cmd_partition(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from osfl.data.partition import make_federation
    from osfl.data.sources import load_data

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
    console = Console()
    console.print(table)
    console.print(f"federation written to {path}")
    if args.plot:
        from osfl.data.plot import plot_class_counts

        console.print(
            f"heat map written to {plot_class_counts(fed, args.plot, class_names=list(train.classes))}"
        )
    return 0


# --------------------------------------------------------------------------- list
def registries() -> dict[str, list[str]]:
    """Every registry a user can name in a config, by kind."""
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.data.partition import PARTITIONS
    from osfl.data.sources import list_datasets
    from osfl.data.transforms import PIPELINES
    from osfl.fl.method import METHODS
    from osfl.models import list_models
    from osfl.privacy import ATTACKS

    def describe(name: str) -> str:
        cls = METHODS.get(name)
        tags = [
            t
            for t, on in (
                ("one-shot", cls.one_shot),
                ("default run", cls.default_run),
            )
            if on
        ]
        return f"{name} ({', '.join(tags)})" if tags else name

    out = {
        "datasets": list_datasets(),
        "partition schemes": PARTITIONS.names(),
        "models": list(list_models()),
        "methods": [describe(n) for n in METHODS.names()],
        "transform pipelines": PIPELINES.names(),
    }
    out["attacks"] = ATTACKS.names()
    return out


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if args.method:
        import osfl.methods  # noqa: F401  (registers the methods)
        from osfl.config import config_tree
        from osfl.fl.method import METHODS

        cls = METHODS.get(args.method)
        console.print(f"[bold]{cls.name}[/bold]: {(cls.__doc__ or '').strip().splitlines()[0]}")
        console.print(f"options (set as method.{cls.name}.<key>=<value>), with their defaults:")
        console.print(config_tree(cls.Config).rstrip() or "(none)", markup=False)
        return 0
    for kind, names in registries().items():
        console.print(f"[bold]{kind}[/bold] ({len(names)}): " + ", ".join(names))
    return 0


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osfl", description="Federated learning of image classifiers."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment (no argument: the embedded default)")
    run.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG.yaml | key=value",
        help="a config file and/or dotted overrides such as train.lr=0.01",
    )
    run.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2",
        help="grid over a key's values (repeatable); results are mean ± std over seeds",
    )
    run.add_argument("--out", help="run directory (default: runs/<timestamp>-<name>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    part = sub.add_parser("partition", help="split a dataset among clients and save the federation")
    part.add_argument(
        "--dataset", required=True, help="data spec, e.g. digits or imagefolder:<dir>"
    )
    part.add_argument("--scheme", required=True, help="partition scheme (see `osfl list`)")
    group = part.add_mutually_exclusive_group()
    group.add_argument("--alpha", type=float, help="Dirichlet concentration (dirichlet)")
    group.add_argument("--classes-per-client", type=int, help="classes per client (pathological)")
    part.add_argument("--min-partition-size", type=int, help="smallest client size (dirichlet)")
    part.add_argument("--clients", type=int, required=True, help="number of clients")
    part.add_argument("--seed", type=int, default=0)
    part.add_argument("--out", required=True, help="output JSON file")
    part.add_argument("--plot", help="also write the class-count heat map to this PNG")
    part.set_defaults(func=cmd_partition)

    lst = sub.add_parser("list", help="list datasets, partition schemes, models, methods, attacks")
    lst.add_argument(
        "--method", metavar="NAME", help="print one method's full option tree with its defaults"
    )
    lst.set_defaults(func=cmd_list)

    aud = sub.add_parser("audit", help="score privacy attacks on a run's recorded observations")
    aud.add_argument("run_dir", metavar="RUN_DIR", help="a run directory recorded with audit=[...]")
    aud.add_argument(
        "--attack",
        action="append",
        required=True,
        help="attack to score (repeatable): rlu, llg+, zlg+, irlg (see `osfl list`)",
    )
    aud.add_argument(
        "--aux-per-class",
        type=int,
        default=100,
        help="auxiliary test images per class the server holds (default 100, as the paper)",
    )
    aud.add_argument("--aux-seed", type=int, default=0, help="seed of the auxiliary draw")
    aud.add_argument(
        "--option",
        action="append",
        metavar="ATTACK.KEY=VALUE",
        help="an attack option, e.g. rlu.num_samples=1000 (repeatable)",
    )
    aud.add_argument("--device", default="cpu", help="device the attacks run on (default cpu)")
    aud.set_defaults(func=cmd_audit)
    return parser


def _setup_logging(verbose: int) -> None:
    from rich.logging import RichHandler

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logger = logging.getLogger("osfl")
    handler = next((h for h in logger.handlers if isinstance(h, RichHandler)), None)
    if handler is None:
        handler = RichHandler(show_path=False, show_time=False)
        logger.addHandler(handler)
    handler.setLevel(level)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``osfl`` script; user errors exit with status 2."""
    parser = build_parser()
    # ``osfl run CONFIG --out DIR key=value``: overrides may follow options.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "run" or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.items = [*args.items, *extra]
    _setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except (OsflError, OSError) as e:  # OSError: a path the user gave cannot be read/written
        print(f"osfl: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("osfl: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
