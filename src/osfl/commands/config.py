"""``osfl config show [CONFIG.yaml ...] [key=value ...]``: the resolved config, without running.

What a run of the same arguments would use, every key set, after each file's
``base:`` and the overrides (docs/design.md §5); the layers are listed first
as YAML comments, so the output is itself a config ``osfl run`` takes
(``base: none``: it holds every key). The dry run a Hydra or Lightning user
reaches for before a long job.
"""

from __future__ import annotations

import argparse
from typing import Any

from osfl.commands.common import name_from_file, split_config_files


def cmd_config_show(args: argparse.Namespace) -> int:
    # heavy: omegaconf (osfl.config)
    from osfl.config import config_layers_of, load_config, to_yaml

    configs, overrides = split_config_files(args.items)
    named = name_from_file(configs, overrides)  # as osfl run names the run
    cfg = load_config(configs or None, [*named, *overrides])  # refuses bad input first
    sources = [source for _, source in config_layers_of(configs or None)]
    if named:
        sources.append(f"the run's name, from the file's: {named[0]}")
    if overrides:
        sources.append("command-line overrides: " + " ".join(overrides))
    print("# layers, in order (each overrides those above it):")
    print("#   dataclass defaults (osfl/config/schema.py)")
    for source in sources:
        print(f"#   {source}")
    print(to_yaml(cfg), end="")
    return 0


def add_parser(sub: Any) -> None:
    config = sub.add_parser("config", help="inspect a run's config without running it")
    verbs = config.add_subparsers(dest="config_command", required=True)
    show = verbs.add_parser(
        "show",
        help="print the resolved config of CONFIG.yaml ... key=value ... (the layers first)",
    )
    show.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG_OR_OVERRIDE",
        help="config files (composed in order) and/or dotted overrides such as train.lr=0.01",
    )
    show.set_defaults(func=cmd_config_show)
