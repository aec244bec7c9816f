"""``osfl suite run|plan|list|pack|mfu|import``: a lent GPU's budget as
paper-scale runs and REPRODUCTION rows (docs/gpu-suite.md)."""

from __future__ import annotations

import argparse
import os
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osfl.errors import ConfigError

if TYPE_CHECKING:
    from osfl.suite.execute import RunCommand


def cmd_plan(args: argparse.Namespace) -> int:
    """``osfl suite plan``: what ``--leases`` successive leases would run at
    the rates of ``--rates``, with the repository's rows, encoder and learned
    factors (no GPU; :mod:`osfl.suite.preview`)."""
    # heavy: the planner and the bundle readers (~30 ms); `osfl --help` needs none of it
    from osfl.suite.bundle import read_json
    from osfl.suite.encoder import committed_encoder  # heavy: the planner
    from osfl.suite.learn import learned_in  # heavy: the planner
    from osfl.suite.preview import preview_leases, preview_text  # heavy: the planner
    from osfl.suite.step_io import check_budget, rows_in_repo  # heavy: numpy (the pack)

    check_budget(args.minutes, what="--minutes")
    check_budget(args.lease_minutes, what="--lease-minutes")
    if args.leases < 1:
        raise ConfigError(f"--leases must be at least 1, got {args.leases}")
    repo = Path(args.repo)
    sections = _sections(args)
    pv = preview_leases(
        read_json(Path(args.rates), dict),
        minutes=args.minutes,
        leases=args.leases,
        sections=sections,
        in_repo=rows_in_repo(repo),
        encoder=committed_encoder(repo) is not None,
        learned=learned_in(repo),
        lease_minutes=args.lease_minutes,
    )
    print(preview_text(pv, args.lease_minutes), end="")
    return 0


def cmd_mfu(args: argparse.Namespace) -> int:
    """``osfl suite mfu``: the MFU benchmark (:mod:`osfl.suite.mfu`)."""
    # heavy: torch (the benchmark)
    from osfl.suite import mfu

    return mfu.main(args.rest)


def cmd_pack(args: argparse.Namespace) -> int:
    """``osfl suite pack``: the image pack, weights and wheels a lent GPU carries."""
    # heavy: numpy, torch (osfl.suite.pack reads packs through osfl.data)
    from osfl.suite.pack import check_max_per_class, download_lent_wheels, pack

    check_max_per_class(args.max_per_class)  # before any download; pack() leaves no --out
    source = args.cifar10 or os.environ.get("OSFL_CIFAR10")
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download_lent_wheels(Path(tmp)) if args.wheels else []
        manifest = pack(
            args.out,
            cifar10=source,
            weights=args.weights or [],
            wheels=wheels,
            max_per_class=args.max_per_class,
        )
    for name, entry in manifest["files"].items():
        print(f"{args.out}/{name}: {entry['bytes'] / 2**20:.1f} MiB")
    print(
        f"total {manifest['total_bytes'] / 2**20:.1f} MiB of "
        f"{manifest['limit_bytes'] / 2**20:.0f} MiB"
    )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """``osfl suite import``: a bundle's rows, seconds, rates and MFU into the repository."""
    # heavy: the bundle readers (~6 ms); only `osfl suite import` pays for them
    from osfl.suite.importer import import_bundle

    counts = import_bundle(Path(args.bundle), Path(args.repo), allow_dry_run=args.allow_dry_run)
    for section, n in counts.items():
        if section == "encoder":
            print("encoder -> reproduction/gpu_suite/ (commit it: later leases read it)")
        else:
            print(f"{section}: {n} row(s) -> reproduction/gpu_suite_{section}.json")
    print("the job's seconds -> reproduction/gpu_suite/state.json; rates and MFU -> BENCHMARKS.md")
    return 0


def _sections(args: argparse.Namespace) -> list[str]:
    return [s for s in (args.sections or "").split(",") if s]


def cmd_list(args: argparse.Namespace) -> int:
    """``osfl suite list``: the catalogue's steps in order, with their commands."""
    # heavy: the catalogue and planner (~20 ms); `osfl --help` needs none of it
    from osfl.suite.catalogue import STEPS
    from osfl.suite.plan import select_steps  # heavy: the planner
    from osfl.suite.steps import command_text  # heavy: dataclasses (~8 ms, which osfl.cli lacks)

    for step in select_steps(_sections(args), STEPS):
        print(f"{step.section:9} {step.name:28} {command_text(step.argv)}")
    return 0


def cmd_run(args: argparse.Namespace, run_command: RunCommand) -> int:
    """``osfl suite run``: preflight, measure, plan and run the steps in the budget."""
    # heavy: numpy (osfl.suite.execute reads packs), torch once a step runs
    from osfl.suite.bundle import read_json
    from osfl.suite.execute import SuiteRequest, check_budget, run_suite  # heavy: numpy, torch

    check_budget(args.budget)  # nan, inf, <= 0: one line, before anything is written
    pack_dir = Path(args.pack) if args.pack and Path(args.pack).exists() else None
    names = [s for s in (args.steps or "").split(",") if s]
    rates = read_json(Path(args.rates), dict) if args.rates else None
    req = SuiteRequest(
        out=Path(args.out),
        budget_min=args.budget,
        sections=_sections(args),
        step_names=names,
        dry_run=args.dry_run,
        pack_dir=pack_dir,
        rates=rates,
        bundle=Path(args.bundle) if args.bundle else None,
        repo=None if args.dry_run else Path("."),
        then_min=args.then,
        preflight=args.preflight,
    )
    result = run_suite(req, run_command)
    done = sum(p.status == "done" for p in result.planned)
    print(
        f"{done} of {len(result.planned)} steps finished in {result.wall_s:.0f} s "
        f"(rates {result.rates_s:.0f} s); rows: {args.out}/reproduction_gpu.md, bundle: "
        f"{args.bundle or Path(args.out) / 'bundle'}"
    )
    return 0


#: ``osfl suite <command>`` -> its function (``run`` also takes the CLI's entry point)
SUITE_COMMANDS: dict[str, Any] = {
    "plan": cmd_plan,
    "mfu": cmd_mfu,
    "pack": cmd_pack,
    "import": cmd_import,
    "list": cmd_list,
}


def cmd_suite(args: argparse.Namespace, run_command: RunCommand) -> int:
    """``osfl suite run|plan|list|pack|mfu|import``: a lent GPU's minutes as
    REPRODUCTION rows (docs/gpu-suite.md). ``run_command`` runs one osfl
    command in this process (``osfl.cli.main``, which the CLI hands in)."""
    command = SUITE_COMMANDS.get(args.suite_command)
    return command(args) if command is not None else cmd_run(args, run_command)


def add_parser(sub: Any, run_command: RunCommand) -> None:
    """``osfl suite`` and its commands; ``run_command`` is the CLI's own entry
    point (``osfl.cli.main``), handed in: this module cannot import it back."""
    func = partial(cmd_suite, run_command=run_command)
    suite = sub.add_parser(
        "suite", help="a lent GPU's budget as paper-scale runs and REPRODUCTION rows"
    )
    ssub = suite.add_subparsers(dest="suite_command", required=True)
    srun = ssub.add_parser("run", help="measure, plan within the budget, run, write the rows")
    srun.add_argument("--budget", type=float, required=True, help="device minutes to spend")
    srun.add_argument(
        "--sections", help="comma-separated sections (default all): pretrain,frozen,fafi,mfu,eftvit"
    )
    srun.add_argument("--out", default="runs/suite", help="the suite's directory")
    srun.add_argument("--pack", default="gpu_pack", help="the packed data folder, if present")
    srun.add_argument(
        "--dry-run",
        action="store_true",
        help="the same path on a CPU at a tiny scale (8-px digits)",
    )
    srun.add_argument(
        "--steps",
        help="comma-separated step names: only these (and what they "
        "need), run even when over the plan's budget or cap",
    )
    srun.add_argument("--rates", help="a rates.json to plan with instead of measuring")
    srun.add_argument("--bundle", help="where the bundle goes (default OUT/bundle)")
    srun.add_argument(
        "--then",
        type=float,
        default=0.0,
        help="minutes of the lease's later command on this machine (default 0: "
        "none; scripts/gpu_job.sh sets it)",
    )
    srun.add_argument(
        "--preflight",
        default="auto",
        choices=["auto", "all", "imports", "none"],
        help="before any step: the imports and every method on the GPU (all), the "
        "imports only, or nothing (default auto: all, imports in a dry run)",
    )
    srun.set_defaults(func=func)
    splan = ssub.add_parser("plan", help="preview what successive leases would run (no GPU)")
    splan.add_argument("--rates", required=True, help="a rates.json (a job's, or by hand)")
    splan.add_argument(
        "--minutes",
        type=float,
        default=10.0,
        help="the first command's minutes (default 10; the later one gets what "
        "is left of the lease)",
    )
    splan.add_argument("--leases", type=int, default=3, help="how many leases (default 3)")
    splan.add_argument(
        "--lease-minutes",
        type=float,
        default=15.0,
        help="a lease's device minutes, the machine's start included (default 15)",
    )
    splan.add_argument("--sections", help="comma-separated sections (default all)")
    splan.add_argument("--repo", default=".", help="the repository root (default .)")
    splan.set_defaults(func=func)
    simp = ssub.add_parser("import", help="a job's bundle into reproduction/ and REPRODUCTION.md")
    simp.add_argument("bundle", help="the bundle folder a job returned")
    simp.add_argument("--repo", default=".", help="the repository root (default .)")
    simp.add_argument(
        "--allow-dry-run", action="store_true", help="import a dry run's rows too (tests only)"
    )
    simp.set_defaults(func=func)
    slist = ssub.add_parser("list", help="the catalogue of steps in order of value")
    slist.add_argument("--sections", help="comma-separated sections (default all)")
    slist.set_defaults(func=func)
    spack = ssub.add_parser("pack", help="pack CIFAR-10 and weights for a lent machine")
    spack.add_argument("--out", default="gpu_pack", help="the pack folder (git-ignored)")
    spack.add_argument("--cifar10", help="the CIFAR-10 image folder (default $OSFL_CIFAR10)")
    spack.add_argument("--weights", action="append", help="a weights file (repeatable)")
    spack.add_argument("--max-per-class", type=int, help="pack at most N >= 1 images per class")
    spack.add_argument(
        "--wheels",
        action="store_true",
        help="also pack the Python packages the lent machine lacks (pip download)",
    )
    spack.set_defaults(func=func)
    smfu = ssub.add_parser(
        "mfu", help="MFU of one training step (osfl suite mfu --help)", add_help=False
    )
    smfu.add_argument("rest", nargs=argparse.REMAINDER)
    smfu.set_defaults(func=func)
