"""``osfl audit RUN_DIR --attack NAME ...``: score privacy attacks on a run's
recorded observations (docs/privacy.md, "Auditing a run")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from osfl.commands.common import get_console, verbose_here
from osfl.errors import ConfigError


def cmd_audit(args: argparse.Namespace) -> int:
    """``osfl audit RUN_DIR --attack rlu ...``: score attacks on a run's recorded
    Observations (docs/privacy.md, "Auditing a run")."""
    # heavy: omegaconf, torch (osfl.audit_dir, osfl.privacy)
    from omegaconf import OmegaConf

    from osfl.audit_dir import audit_run_dir  # heavy: torch (the assembly layer)
    from osfl.privacy.audit import audit_rich_table, parse_audit  # heavy: torch

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
    console = get_console()
    table = audit_rich_table(results, title=f"privacy audit — {args.run_dir}")
    if table is not None:
        console.print(table)
    console.print(f"results written to {Path(args.run_dir) / 'audit.json'} and metrics.json")
    return 0


def _check_device(name: str) -> None:
    """``--device NAME`` is a device this machine has (one line when not)."""
    # heavy: torch
    import torch

    from osfl.assembly import resolve_device  # heavy: torch (the assembly layer)

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


def add_parser(sub: Any) -> None:
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
    verbose_here(aud)
    aud.set_defaults(func=cmd_audit)
