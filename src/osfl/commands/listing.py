"""``osfl list [--method NAME]``: the names a config can use (datasets,
partition schemes, models, methods, transform pipelines, attacks), or one
method's paper and options. Methods from other installed packages (their
``osfl.methods`` entry points, docs/adding-a-method.md) are listed with the
built-ins and say which package they come from."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from osfl.commands.common import get_console, verbose_here
from osfl.errors import ConfigError
from osfl.fl.regimes import REGIMES, UPLOAD_KINDS

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
    from osfl.data.partition import PARTITIONS  # heavy: torch
    from osfl.data.sources import list_datasets  # heavy: torch
    from osfl.data.transforms import PIPELINES  # heavy: torch
    from osfl.fl.method import METHODS  # heavy: torch
    from osfl.models import list_models  # heavy: torch
    from osfl.privacy import ATTACKS  # heavy: torch

    return {
        "datasets": list_datasets(),
        "partition schemes": PARTITIONS.names(),
        "models": list(list_models()),
        "methods": METHODS.names(),
        "transform pipelines": PIPELINES.names(),
        "attacks": ATTACKS.names(),
    }


def _rounds_label(cls: Any) -> str:
    # heavy: torch (osfl.fl.method)
    from osfl.fl.method import default_rounds

    rounds = default_rounds(cls)
    return "one-shot" if cls.card.one_shot and rounds == 1 else str(rounds)


def _methods_table(names: Sequence[str]) -> Any:
    """One row per method, grouped by regime: rounds, uploads, what it does."""
    # heavy: rich, torch (osfl.fl.method)
    from rich.table import Table

    from osfl.fl.method import METHODS  # heavy: torch

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

    import osfl.methods  # noqa: F401  (heavy: torch; registers the methods)
    from osfl.config import config_options  # heavy: omegaconf
    from osfl.fl.method import METHODS, capabilities_of  # heavy: torch

    cls = METHODS.get(name)
    card = cls.card
    console.print(f"[bold]{cls.name}[/bold]: {card.summary}", highlight=False)
    console.print(f"paper: {card.paper or '(an osfl baseline)'}", markup=False, highlight=False)
    origin = METHODS.origin(cls.name)
    if origin is not None:
        console.print(f"from: {origin}", markup=False, highlight=False)
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
    console = get_console()
    if args.method is not None:  # --method "" is a name to refuse, not "all of them"
        if not args.method.strip():
            raise ConfigError("--method needs a method name (osfl list shows them all)")
        _describe_method(console, args.method)
        return 0
    kinds = registries()
    console.print(_names_table({k: v for k, v in kinds.items() if k != "methods"}))
    console.print(_methods_table(kinds["methods"]))
    _print_plugins(console, kinds["methods"])
    return 0


def _print_plugins(console: Any, names: Sequence[str]) -> None:
    """One line per method another installed package adds: where it comes from."""
    from osfl.fl.method import METHODS  # heavy: torch

    for name in names:
        origin = METHODS.origin(name)
        if origin is not None:
            console.print(f"plugin {name}: {origin}", markup=False, highlight=False)


def add_parser(sub: Any) -> None:
    lst = sub.add_parser("list", help="list datasets, partition schemes, models, methods, attacks")
    lst.add_argument(
        "--method",
        metavar="NAME",
        help="one method: what it does, its paper, and every option with its default",
    )
    verbose_here(lst)
    lst.set_defaults(func=cmd_list)
