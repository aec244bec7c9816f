"""The ``osfl`` command line (docs/design.md §5).

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
import json
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osfl import __version__
from osfl.errors import ConfigError, OsflError
from osfl.fl.progress import Progress, RichProgress
from osfl.fl.regimes import REGIMES, UPLOAD_KINDS

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


def cmd_run(args: argparse.Namespace) -> int:
    # heavy: torch and the whole run stack (osfl.runner); `osfl --help` must not pay for it
    from osfl.runner import RunRequest, run

    _check_sweep_spacing(args.sweep or [], args.items)
    config, overrides = _split_run_args(args.items)
    mode, out = "new", args.out
    if args.resume:
        if config is not None or args.overwrite:
            raise ConfigError(
                "--resume DIR re-runs DIR/config.yaml: give no other config file and no --overwrite"
            )
        if out is not None and Path(out) != Path(args.resume):
            raise ConfigError(f"--resume {args.resume} writes there; drop --out {out}")
        if not (Path(args.resume) / "config.yaml").is_file():
            raise ConfigError(f"{args.resume} holds no osfl run to resume (no config.yaml)")
        mode, out, config = "resume", args.resume, str(Path(args.resume) / "config.yaml")
    elif args.overwrite:
        mode = "overwrite"
    if args.no_progress:
        overrides.append("progress=false")
    console = _console()
    req = RunRequest(
        config=config,
        overrides=overrides,
        sweeps=args.sweep or [],
        out=out,
        mode=mode,
        command=f"osfl run {' '.join(args.items)}".rstrip(),
    )
    outcome = run(
        req,
        lambda enabled: _progress_board(console, enabled),
        announce=lambda text: console.print(f"[bold]{text}[/bold]"),
    )
    records = outcome.records
    _print_scoreboards(console, records, f"{outcome.base.name} — {outcome.base.data.source}")
    if any("audit" in r for r in records):
        # heavy: torch (osfl.privacy)
        from osfl.privacy.audit import audit_rich_table

        table = audit_rich_table(records)
        if table is not None:
            console.print(table)
    console.print(f"run directory: {outcome.out}  ({outcome.wall_s:.1f} s)")
    return 0


def _print_scoreboards(console: Any, records: Sequence[Any], title: str) -> None:
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


# --------------------------------------------------------------------------- table
def cmd_table(args: argparse.Namespace) -> int:
    """``osfl table RUN_DIR ...``: one scoreboard per regime from several runs on
    the same clients (refused when their clients differ)."""
    # heavy: torch (osfl.report, osfl.scoreboard)
    from osfl import report
    from osfl.scoreboard import merge_runs

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
        _print_scoreboards(_console(), records, " + ".join(args.run_dirs))
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


#: The console of the running command (:func:`main` makes it; logging writes through it).
_CONSOLE: Any = None
#: Piped output is this wide: no table is wrapped or cut (rich would assume 80 columns).
PIPED_WIDTH = 1000


def _console() -> Any:
    """The console every command prints through, and logging too in a terminal
    (so that log lines go above the live progress bars instead of onto them).
    Piped to a file or another program: no colour codes, and wide enough that
    no table is wrapped or cut."""
    global _CONSOLE
    if _CONSOLE is None:
        _CONSOLE = _make_console()
    return _CONSOLE


def _make_console() -> Any:
    # heavy: rich (~25 ms, as much as the rest of this module; `osfl --help` needs none of it)
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH, color_system=None)


def _progress_board(console: Any, enabled: bool) -> Any:
    """One live progress display for the whole run when the output is a
    terminal (bars of local training, rounds and server phases stack on it);
    the silent board otherwise or with ``--no-progress``."""
    return RichProgress(console) if enabled and console.is_terminal else Progress()


# --------------------------------------------------------------------------- audit
def cmd_audit(args: argparse.Namespace) -> int:
    """``osfl audit RUN_DIR --attack rlu ...``: score attacks on a run's recorded
    Observations (docs/privacy.md, "Auditing a run")."""
    # heavy: omegaconf, torch (osfl.audit_dir, osfl.privacy)
    from omegaconf import OmegaConf

    from osfl.audit_dir import audit_run_dir
    from osfl.privacy.audit import audit_rich_table, parse_audit

    if args.aux_per_class < 1:
        raise ConfigError(f"--aux-per-class must be >= 1, got {args.aux_per_class}")
    if not 0 <= args.aux_seed < 2**63:
        raise ConfigError(f"--aux-seed must be from 0 to 2**63 - 1, got {args.aux_seed}")
    _check_device(args.device)
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
    console = _console()
    table = audit_rich_table(results, title=f"privacy audit — {args.run_dir}")
    if table is not None:
        console.print(table)
    console.print(f"results written to {Path(args.run_dir) / 'audit.json'} and metrics.json")
    return 0


def _check_device(name: str) -> None:
    """``--device NAME`` is a device this machine has (one line when not)."""
    # heavy: torch
    import torch

    from osfl.assembly import resolve_device

    try:
        dev = resolve_device(name)
    except RuntimeError as e:  # torch's own words for a name it cannot parse
        raise ConfigError(f"--device {name!r}: {str(e).splitlines()[0]}") from None
    gpus = torch.cuda.device_count()
    if dev.type == "cpu" or (dev.type == "mps" and torch.backends.mps.is_available()):
        return
    if dev.type != "cuda" or (dev.index or 0) >= gpus:
        raise ConfigError(
            f"--device {name!r} is not on this machine (cpu, or cuda:0..cuda:{gpus - 1})"
            if gpus
            else f"--device {name!r} is not on this machine (no GPU visible: use cpu)"
        )


# --------------------------------------------------------------------------- partition
def cmd_partition(args: argparse.Namespace) -> int:
    # heavy: rich, torch (osfl.data)
    from rich.table import Table

    from osfl.data.partition import make_federation
    from osfl.data.sources import load_data

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
    console = _console()
    console.print(table)
    console.print(f"federation written to {path}")
    if args.plot:
        # heavy: matplotlib
        from osfl.data.plot import plot_class_counts

        console.print(
            f"heat map written to {plot_class_counts(fed, args.plot, class_names=list(train.classes))}"
        )
    return 0


# --------------------------------------------------------------------------- list
#: Where a config names a member of each registry.
_SET_AS = {
    "datasets": "data.source (NAME or NAME:<path>)",
    "partition schemes": "partition.scheme",
    "models": "model.name",
    "transform pipelines": "transform.train, transform.eval",
    "attacks": "audit: [NAME, ...]; osfl audit --attack NAME",
}


def registries() -> dict[str, list[str]]:
    """Every registry a user can name in a config, by kind (methods included)."""
    # heavy: torch (every registry lives with its layer)
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.data.partition import PARTITIONS
    from osfl.data.sources import list_datasets
    from osfl.data.transforms import PIPELINES
    from osfl.fl.method import METHODS
    from osfl.models import list_models
    from osfl.privacy import ATTACKS

    return {
        "datasets": list_datasets(),
        "partition schemes": PARTITIONS.names(),
        "models": list(list_models()),
        "methods": METHODS.names(),
        "transform pipelines": PIPELINES.names(),
        "attacks": ATTACKS.names(),
    }


def _rounds_label(cls: Any) -> str:
    from osfl.fl.method import default_rounds

    rounds = default_rounds(cls)
    return "one-shot" if cls.card.one_shot and rounds == 1 else str(rounds)


def _methods_table(names: Sequence[str]) -> Any:
    """One row per method, grouped by regime: rounds, uploads, what it does."""
    # heavy: rich, torch (osfl.fl.method)
    from rich.table import Table

    from osfl.fl.method import METHODS

    table = Table(title="methods (osfl list --method NAME: its paper and options)")
    for col in ("method", "regime", "rounds", "uploads", "what it does"):
        table.add_column(col, no_wrap=col != "what it does")
    classes = sorted(
        (METHODS.get(n) for n in names), key=lambda c: (list(REGIMES).index(c.card.regime), c.name)
    )
    regime = None
    for cls in classes:
        if regime is not None and cls.card.regime != regime:
            table.add_section()
        regime = cls.card.regime
        card = cls.card
        table.add_row(cls.name, card.regime, _rounds_label(cls), card.uploads, card.summary)
    return table


def _names_table(kinds: dict[str, list[str]]) -> Any:
    # heavy: rich
    from rich.table import Table

    table = Table(title="names a config can use")
    for col in ("kind", "set as", "names"):
        table.add_column(col, no_wrap=col != "names", max_width=None if col != "names" else 90)
    for kind, names in kinds.items():
        table.add_row(kind, _SET_AS[kind], ", ".join(names))
    return table


def _describe_method(console: Any, name: str) -> None:
    """``osfl list --method NAME``: what it does, its paper, how it runs, and
    every option with its default and description."""
    # heavy: rich, torch (osfl.methods, osfl.config)
    from rich.table import Table

    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.config import config_options
    from osfl.fl.method import METHODS, capabilities_of

    cls = METHODS.get(name)
    card = cls.card
    console.print(f"[bold]{cls.name}[/bold]: {card.summary}", highlight=False)
    console.print(f"paper: {card.paper or '(an osfl baseline)'}", markup=False, highlight=False)
    console.print(
        f"regime {card.regime} ({REGIMES[card.regime]}); uploads {card.uploads} "
        f"({UPLOAD_KINDS[card.uploads]}); rounds: {_rounds_label(cls)}",
        markup=False,
        highlight=False,
    )
    console.print(f"capabilities: {', '.join(capabilities_of(cls)) or '(core only)'}")
    recipe = ", ".join(f"{k}: {v}" for k, v in card.train_defaults.items())
    console.print(
        "local training: the run's train.* "
        + (f"with this method's defaults {recipe} " if recipe else "")
        + f"(method_train.{cls.name}.<key>=<value> for this method alone)",
        markup=False,
        highlight=False,
    )
    options = config_options(cls.Config)
    if not options:
        console.print("options: none")
        return
    table = Table(title=f"options: method.{cls.name}.<option>=<value>")
    for col in ("option", "default", "what it sets"):
        table.add_column(col, no_wrap=col == "option")
    for o in options:
        table.add_row(o.key, o.default, o.help)
    console.print(table)


def cmd_list(args: argparse.Namespace) -> int:
    console = _console()
    if args.method is not None:  # --method "" is a name to refuse, not "all of them"
        if not args.method.strip():
            raise ConfigError("--method needs a method name (osfl list shows them all)")
        _describe_method(console, args.method)
        return 0
    kinds = registries()
    console.print(_names_table({k: v for k, v in kinds.items() if k != "methods"}))
    console.print(_methods_table(kinds["methods"]))
    return 0


# --------------------------------------------------------------------------- pretrain
def cmd_pretrain(args: argparse.Namespace) -> int:
    """``osfl pretrain --upstream SPEC --out FILE.safetensors [CONFIG.yaml] [key=value ...]``:
    train an encoder on declared upstream data and write it with its model card
    (docs/pretrain.md); ``--disjoint-from RUN.yaml`` refuses upstream data that
    overlaps that run's data before anything trains."""
    # heavy: torch and the whole pretraining stack; osfl.pretrain.card alone is light,
    # but at module level it (with hashlib) would add ~4 ms, half again, to `import osfl.cli`
    from osfl.assembly import load_splits
    from osfl.config import load_config
    from osfl.pretrain.card import check_disjoint
    from osfl.pretrain.config import load_pretrain_config
    from osfl.pretrain.export import save_encoder, upstream_block
    from osfl.pretrain.train import pretrain
    from osfl.pretrain.upstream import load_upstream, parse_classes

    config, overrides = _split_run_args(args.items)
    shortcuts = {
        "upstream.source": args.upstream,
        "objective": args.objective,
        "model.name": args.model,
        "train.epochs": args.epochs,
    }
    overrides += [f"{k}={v}" for k, v in shortcuts.items() if v is not None]
    if args.classes is not None:
        overrides.append(f"upstream.classes={json.dumps(parse_classes(args.classes))}")
    if args.upstream is None and config is None:
        raise ConfigError("declare the upstream data: --upstream SPEC (or a pretrain config file)")
    if not args.out:
        raise ConfigError("give the output weights file: --out FILE.safetensors")
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ConfigError(f"--out {str(out)!r} must end in .safetensors")
    if out.exists() and not args.force:
        raise ConfigError(f"{str(out)!r} exists; pass --force to overwrite it")
    cfg = load_pretrain_config(config, overrides)
    up = cfg.upstream
    upstream = load_upstream(
        up.source,
        up.classes,
        image_size=up.image_size,
        channels=up.channels,
        max_per_class=up.max_per_class,
        cache_dir=up.cache_dir,
        options=dict(up.options),
    )
    console = _console()
    known = {"upstream": upstream_block(upstream)}
    for task_path in args.disjoint_from or []:  # refuse before anything trains
        task = load_config(task_path)
        train = load_splits(task).train
        present = [train.classes[i] for i in sorted(set(train.labels.tolist()))]
        check_disjoint(known, task.data.source, present, train.fingerprint())
        console.print(f"upstream is disjoint from {task_path} ({task.data.source}: {present})")
    with _progress_board(console, not args.no_progress) as board:
        result = pretrain(cfg, upstream, progress=board)
    command = ["osfl", "pretrain", *(f"--disjoint-from={p}" for p in args.disjoint_from or [])]
    command += [f"--out={out}", *([config] if config else []), *overrides]
    if args.force:
        command.append("--force")
    card_file, card = save_encoder(cfg, upstream, result, out, [shlex.join(command)])
    held = ", ".join(f"{k} {v:.4g}" for k, v in result.held_out.items())
    console.print(
        f"{card['objective']['name']} encoder on {len(upstream.train)} images of "
        f"{upstream.source} {list(upstream.classes)}: final loss {result.final_loss:.4f}; "
        f"held-out {held}"
    )
    console.print(
        f"weights written to {out} ({card['weights']['bytes']} bytes, sha256 "
        f"{card['weights']['sha256'][:16]}...), card to {card_file}  ({result.seconds:.1f} s)"
    )
    return 0


# --------------------------------------------------------------------------- suite
def cmd_suite(args: argparse.Namespace) -> int:
    """``osfl suite run|list|pack|mfu|import``: a lent GPU's minutes as
    REPRODUCTION rows (docs/gpu-suite.md)."""
    if args.suite_command == "mfu":
        # heavy: torch (the benchmark)
        from osfl.suite import mfu

        return mfu.main(args.rest)
    if args.suite_command == "pack":
        # heavy: numpy, torch (osfl.suite.pack reads packs through osfl.data)
        from osfl.suite.pack import check_max_per_class, download_lent_wheels, pack

        check_max_per_class(args.max_per_class)  # before any download; pack() leaves no --out
        source = args.cifar10 or os.environ.get("OSFL_CIFAR10")
        with tempfile.TemporaryDirectory() as tmp:
            wheels = download_lent_wheels(Path(tmp)) if args.wheels else []
            manifest = pack(args.out, cifar10=source, weights=args.weights or [],
                            wheels=wheels, max_per_class=args.max_per_class)  # fmt: skip
        for name, entry in manifest["files"].items():
            print(f"{args.out}/{name}: {entry['bytes'] / 2**20:.1f} MiB")
        print(f"total {manifest['total_bytes'] / 2**20:.1f} MiB of "
              f"{manifest['limit_bytes'] / 2**20:.0f} MiB")  # fmt: skip
        return 0
    if args.suite_command == "import":
        from osfl.suite.importer import import_bundle

        counts = import_bundle(Path(args.bundle), Path(args.repo), allow_dry_run=args.allow_dry_run)
        for section, n in counts.items():
            print(f"{section}: {n} row(s) -> reproduction/gpu_suite_{section}.json")
        return 0
    from osfl.suite.catalogue import STEPS
    from osfl.suite.plan import select_steps
    from osfl.suite.steps import command_text

    sections = [s for s in (args.sections or "").split(",") if s]
    if args.suite_command == "list":
        for step in select_steps(sections, STEPS):
            print(f"{step.section:9} {step.name:28} {command_text(step.argv)}")
        return 0
    # heavy: numpy (osfl.suite.execute reads packs), torch once a step runs
    from osfl.suite.bundle import read_json
    from osfl.suite.execute import SuiteRequest, check_budget, run_suite

    check_budget(args.budget)  # nan, inf, <= 0: one line, before anything is written
    pack_dir = Path(args.pack) if args.pack and Path(args.pack).exists() else None
    names = [s for s in (args.steps or "").split(",") if s]
    rates = read_json(Path(args.rates), dict) if args.rates else None
    req = SuiteRequest(out=Path(args.out), budget_min=args.budget, sections=sections,
                       step_names=names, dry_run=args.dry_run, pack_dir=pack_dir, rates=rates,
                       bundle=Path(args.bundle) if args.bundle else None,
                       repo=None if args.dry_run else Path("."))  # fmt: skip
    result = run_suite(req, main)
    done = sum(p.status == "done" for p in result.planned)
    print(f"{done} of {len(result.planned)} steps finished in {result.wall_s:.0f} s "
          f"(rates {result.rates_s:.0f} s); rows: {args.out}/reproduction_gpu.md, bundle: "
          f"{args.bundle or Path(args.out) / 'bundle'}")  # fmt: skip
    return 0


def _add_suite_parser(sub: Any) -> None:
    suite = sub.add_parser(
        "suite", help="a lent GPU's budget as paper-scale runs and REPRODUCTION rows"
    )
    ssub = suite.add_subparsers(dest="suite_command", required=True)
    srun = ssub.add_parser("run", help="measure, plan within the budget, run, write the rows")
    srun.add_argument("--budget", type=float, required=True, help="device minutes to spend")
    srun.add_argument("--sections", help="comma-separated sections (default all): "
                      "pretrain,frozen,fafi,mfu,eftvit")  # fmt: skip
    srun.add_argument("--out", default="runs/suite", help="the suite's directory")
    srun.add_argument("--pack", default="gpu_pack", help="the packed data folder, if present")
    srun.add_argument("--dry-run", action="store_true",
                      help="the same path on a CPU at a tiny scale (8-px digits)")  # fmt: skip
    srun.add_argument("--steps", help="comma-separated step names: only these (and what they "
                      "need), run even when over the plan's budget or cap")  # fmt: skip
    srun.add_argument("--rates", help="a rates.json to plan with instead of measuring")
    srun.add_argument("--bundle", help="where the bundle goes (default OUT/bundle)")
    srun.set_defaults(func=cmd_suite)
    simp = ssub.add_parser("import", help="a job's bundle into reproduction/ and REPRODUCTION.md")
    simp.add_argument("bundle", help="the bundle folder a job returned")
    simp.add_argument("--repo", default=".", help="the repository root (default .)")
    simp.add_argument("--allow-dry-run", action="store_true",
                      help="import a dry run's rows too (tests only)")  # fmt: skip
    simp.set_defaults(func=cmd_suite)
    slist = ssub.add_parser("list", help="the catalogue of steps in order of value")
    slist.add_argument("--sections", help="comma-separated sections (default all)")
    slist.set_defaults(func=cmd_suite)
    spack = ssub.add_parser("pack", help="pack CIFAR-10 and weights for a lent machine")
    spack.add_argument("--out", default="gpu_pack", help="the pack folder (git-ignored)")
    spack.add_argument("--cifar10", help="the CIFAR-10 image folder (default $OSFL_CIFAR10)")
    spack.add_argument("--weights", action="append", help="a weights file (repeatable)")
    spack.add_argument("--max-per-class", type=int, help="pack at most N >= 1 images per class")
    spack.add_argument("--wheels", action="store_true",
                       help="also pack the Python packages the lent machine lacks (pip download)")  # fmt: skip
    spack.set_defaults(func=cmd_suite)
    smfu = ssub.add_parser("mfu", help="MFU of one training step (osfl suite mfu --help)",
                           add_help=False)  # fmt: skip
    smfu.add_argument("rest", nargs=argparse.REMAINDER)
    smfu.set_defaults(func=cmd_suite)


def _add_certs_arguments(certs: argparse.ArgumentParser) -> None:
    """``osfl flower certs``'s arguments, or, where ``cryptography`` is not
    installed (a lent GPU machine), a command that says so: every other
    command must still parse."""
    try:
        # heavy: cryptography (~40 ms): importing osfl.cli stays cheap, only the parser needs it
        from osfl.flower.app import certs as certs_tool
    except ImportError as e:
        missing = str(e)

        def unavailable(args: argparse.Namespace) -> int:
            raise ConfigError(f"osfl flower certs needs the cryptography package ({missing})")

        certs.add_argument("rest", nargs=argparse.REMAINDER)
        certs.set_defaults(func=unavailable)
        return
    certs_tool.add_arguments(certs)
    _verbose_here(certs)
    certs.set_defaults(func=certs_tool.run)


# --------------------------------------------------------------------------- main
VERBOSE_HELP = (
    "more log output: -v shows each client's training and each method's result "
    "(INFO), -vv debug messages; the run directory's run.log always has INFO"
)


def _verbose_here(sub: argparse.ArgumentParser) -> None:
    """``-v`` after the command too (``osfl run -v``); counted with any before it."""
    sub.add_argument(
        "-v", "--verbose", dest="verbose_after", action="count", default=0, help=VERBOSE_HELP
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="osfl", description="Federated learning of image classifiers."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"osfl {__version__}")
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
    _verbose_here(run)
    run.set_defaults(func=cmd_run)

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
    _verbose_here(part)
    part.set_defaults(func=cmd_partition)

    lst = sub.add_parser("list", help="list datasets, partition schemes, models, methods, attacks")
    lst.add_argument(
        "--method",
        metavar="NAME",
        help="one method: what it does, its paper, and every option with its default",
    )
    _verbose_here(lst)
    lst.set_defaults(func=cmd_list)

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
    _verbose_here(tab)
    tab.set_defaults(func=cmd_table)

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
    _verbose_here(aud)
    aud.set_defaults(func=cmd_audit)

    pre = sub.add_parser(
        "pretrain", help="train an encoder on declared upstream data; write weights + model card"
    )
    pre.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG.yaml | key=value",
        help="a pretrain config and/or dotted overrides such as train.lr=0.001 (docs/pretrain.md)",
    )
    pre.add_argument("--upstream", help="upstream data spec, e.g. imagefolder:<dir> or digits")
    pre.add_argument(
        "--classes", help="upstream classes to use, by index or name, e.g. 0,1,2,3,4 (default all)"
    )
    pre.add_argument("--objective", help="supervised, mae or dino (default supervised)")
    pre.add_argument("--model", help="registered model name (default vit_tiny_patch4_32)")
    pre.add_argument("--epochs", type=int, help="training epochs (train.epochs)")
    pre.add_argument("--out", help="output weights file, FILE.safetensors (card: FILE.card.json)")
    pre.add_argument(
        "--disjoint-from",
        action="append",
        metavar="RUN.yaml",
        help="an osfl run config whose data the upstream must not overlap (repeatable)",
    )
    pre.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    pre.add_argument("--no-progress", action="store_true", help="no progress bars")
    _verbose_here(pre)
    pre.set_defaults(func=cmd_pretrain)
    _add_suite_parser(sub)

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
    frun.add_argument("app", help="the osfl app directory (python -m osfl.flower.app DIR)")
    frun.add_argument("superlink", help="the SuperLink connection (a name in flwr's config.toml)")
    frun.add_argument("flwr_args", nargs=argparse.REMAINDER, help="more `flwr run` options")
    _verbose_here(frun)
    frun.set_defaults(func=cmd_flower_run)
    status = fsub.add_parser(
        "status",
        help="exit 0 when RUN_DIR holds a finished run, 1 when it failed or stopped",
    )
    status.add_argument("run_dir", metavar="RUN_DIR", help="a run directory the ServerApp wrote")
    _verbose_here(status)
    status.set_defaults(func=cmd_flower_status)
    return parser


def cmd_flower_run(args: argparse.Namespace) -> int:
    # heavy: Flower's app tooling (osfl.flower.app.local)
    from osfl.flower.app.runs import flower_run

    return flower_run(args.app, args.superlink, list(args.flwr_args))


def cmd_flower_status(args: argparse.Namespace) -> int:
    # heavy: the run-directory readers
    from osfl.flower.app.runs import run_dir_status

    return run_dir_status(args.run_dir)


class _PlainHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Log lines as plain text on stderr (output that is not a terminal)."""


def _setup_logging(verbose: int, console: Any) -> None:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``osfl`` script; user errors exit with status 2."""
    parser = build_parser()
    # ``osfl run CONFIG --out DIR key=value``: overrides may follow options.
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "suite_command", None) == "mfu":
        args.rest, extra = [*extra, *args.rest], []  # the benchmark parses its own options
    if extra:
        if args.command != "run" or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.items = [*args.items, *extra]
    global _CONSOLE
    _CONSOLE = _make_console()
    _setup_logging(args.verbose + getattr(args, "verbose_after", 0), _CONSOLE)
    try:
        return int(args.func(args))
    except (OsflError, OSError) as e:  # OSError: a path the user gave cannot be read/written
        print(f"osfl: error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_status if isinstance(e, OsflError) else 2) from None
    except KeyboardInterrupt:
        print("osfl: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
