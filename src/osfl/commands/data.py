"""``osfl data get NAME [--cache DIR] [--mirror URL]``: download a dataset's
official files into the cache, verified against their published checksums,
and print the ``data.source=...`` override that reads them;
``osfl data list [--cache DIR]``: what can be fetched and what is cached
(``osfl.data.download``; docs/data.md)."""

from __future__ import annotations

import argparse
from typing import Any

from osfl.commands.common import get_console, verbose_here
from osfl.data.download import (
    CACHE_ENV,
    DEFAULT_CACHE,
    DOWNLOADS,
    MIRROR_ENV,
    DownloadProgress,
    cache_root,
    dataset_root,
    get_dataset,
    is_cached,
)


class BarProgress(DownloadProgress):
    """One rich progress bar per file, on the command's console (a terminal only)."""

    def __init__(self, console: Any):
        # heavy: rich (only a terminal draws bars)
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._task: Any = None

    def start(self, name: str, url: str, total: int | None) -> None:
        self._bars.start()
        self._task = self._bars.add_task(name, total=total)

    def advance(self, nbytes: int) -> None:
        self._bars.advance(self._task, nbytes)

    def finish(self) -> None:
        self._bars.stop()


class LineProgress(DownloadProgress):
    """One printed line per file (output that is not a terminal: a log, a pipe)."""

    def __init__(self, console: Any):
        self._console = console

    def start(self, name: str, url: str, total: int | None) -> None:
        size = f" ({total:,} bytes)" if total else ""
        self._console.print(f"downloading {url}{size}", markup=False, highlight=False)


def cmd_data_get(args: argparse.Namespace) -> int:
    console = get_console()
    progress = BarProgress(console) if console.is_terminal else LineProgress(console)
    done = get_dataset(args.name, cache=args.cache, mirror=args.mirror, progress=progress)
    for what, names in (
        ("downloaded and verified", done.downloaded),
        ("already verified", done.skipped),
    ):
        if names:
            console.print(f"{what}: {', '.join(names)}", markup=False, highlight=False)
    console.print(f"{done.name} is in {done.root}; read it with", markup=False, highlight=False)
    console.print(f"  osfl run {done.override}", markup=False, highlight=False)
    return 0


def cmd_data_list(args: argparse.Namespace) -> int:
    # heavy: rich
    from rich.table import Table

    table = Table(title=f"datasets `osfl data get NAME` fetches into {cache_root(args.cache)}")
    for col in ("name", "what", "cached", "data.source"):
        table.add_column(col, no_wrap=col != "what")
    for name in DOWNLOADS.names():
        entry = DOWNLOADS.get(name)
        cached = is_cached(name, args.cache)
        spec = f"{entry.source}:{dataset_root(name, args.cache)}" if cached else ""
        table.add_row(name, entry.what, "yes" if cached else "no", spec)
    get_console().print(table)
    return 0


def add_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="download CIFAR-10/100, MNIST or SVHN into a local cache")
    dsub = data.add_subparsers(dest="data_command", required=True)
    cache_help = f"the cache folder (default: ${CACHE_ENV}, else {DEFAULT_CACHE})"
    get = dsub.add_parser(
        "get", help="download a dataset's official files, check their MD5, unpack them"
    )
    get.add_argument("name", help=f"one of: {', '.join(DOWNLOADS.names())}")
    get.add_argument("--cache", metavar="DIR", help=cache_help)
    get.add_argument(
        "--mirror",
        metavar="URL",
        help=f"replace the scheme and host of every official URL with this one's "
        f"(default: ${MIRROR_ENV}, else the official hosts)",
    )
    verbose_here(get)
    get.set_defaults(func=cmd_data_get)
    lst = dsub.add_parser("list", help="the datasets `osfl data get` knows, and which are cached")
    lst.add_argument("--cache", metavar="DIR", help=cache_help)
    verbose_here(lst)
    lst.set_defaults(func=cmd_data_list)
