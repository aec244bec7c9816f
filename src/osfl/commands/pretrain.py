"""``osfl pretrain --upstream SPEC --out FILE.safetensors [CONFIG.yaml]
[key=value ...]``: train an encoder on declared upstream data; write its weights
and model card (docs/pretrain.md)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from osfl.commands.common import get_console, progress_board, split_run_args, verbose_here
from osfl.errors import ConfigError


def _out_file(args: argparse.Namespace) -> Path:
    """``--out``: a ``.safetensors`` path, not overwritten without ``--force``."""
    if not args.out:
        raise ConfigError("give the output weights file: --out FILE.safetensors")
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ConfigError(f"--out {str(out)!r} must end in .safetensors")
    if out.exists() and not args.force:
        raise ConfigError(f"{str(out)!r} exists; pass --force to overwrite it")
    return out


def cmd_pretrain(args: argparse.Namespace) -> int:
    """``osfl pretrain --upstream SPEC --out FILE.safetensors [CONFIG.yaml] [key=value ...]``:
    train an encoder on declared upstream data and write it with its model card
    (docs/pretrain.md); ``--disjoint-from RUN.yaml`` refuses upstream data that
    overlaps that run's data before anything trains."""
    # heavy: torch and the whole pretraining stack; osfl.pretrain.card alone is light,
    # but at module level it (with hashlib) would add ~4 ms, half again, to `import osfl.cli`
    from osfl.assembly import load_splits
    from osfl.config import load_config  # heavy: omegaconf
    from osfl.pretrain.card import check_disjoint  # heavy: hashlib (~4 ms)
    from osfl.pretrain.config import load_pretrain_config  # heavy: omegaconf
    from osfl.pretrain.export import save_encoder, upstream_block  # heavy: torch
    from osfl.pretrain.train import pretrain  # heavy: torch
    from osfl.pretrain.upstream import load_upstream, parse_classes  # heavy: torch

    config, overrides = split_run_args(args.items)
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
    out = _out_file(args)
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
    console = get_console()
    known = {"upstream": upstream_block(upstream)}
    for task_path in args.disjoint_from or []:  # refuse before anything trains
        task = load_config(task_path)
        train = load_splits(task).train
        present = [train.classes[i] for i in sorted(set(train.labels.tolist()))]
        check_disjoint(known, task.data.source, present, train.fingerprint())
        console.print(f"upstream is disjoint from {task_path} ({task.data.source}: {present})")
    with progress_board(console, not args.no_progress) as board:
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


def add_parser(sub: Any) -> None:
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
    verbose_here(pre)
    pre.set_defaults(func=cmd_pretrain)
