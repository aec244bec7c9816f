"""``osfl data get NAME [--cache DIR] [--mirror URL] [--timeout S] [--max-bytes N]``:
download a dataset's official files into the cache (each within a total time
and size: a slow or endless server is refused, not waited on), verified
against their published checksums, and print the ``data.source=...``
override that reads them;
``osfl data list [--cache DIR]``: what can be fetched and what is cached
(``osfl.data.download``; docs/data.md)."""

from __future__ import annotations

import argparse
from typing import Any

from osfl.commands.common import get_console, verbose_here
from osfl.data.download import (
    CACHE_ENV,
    DEFAULT_CACHE,
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    DOWNLOADS,
    MIRROR_ENV,
    DownloadProgress,
    Limits,
    cache_root,
    dataset_root,
    get_dataset,
    is_cached,
)
from osfl.errors import ConfigError


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
    limits = Limits(
        DEFAULT_TIMEOUT_S if args.timeout is None else seconds(args.timeout),
        DEFAULT_MAX_BYTES if args.max_bytes is None else byte_count(args.max_bytes),
    )
    done = get_dataset(
        args.name, cache=args.cache, mirror=args.mirror, progress=progress, limits=limits
    )
    for what, names in (
        ("downloaded and verified", done.downloaded),
        ("already verified", done.skipped),
    ):
        if names:
            console.print(f"{what}: {', '.join(names)}", markup=False, highlight=False)
    console.print(f"{done.name} is in {done.root}; read it with", markup=False, highlight=False)
    console.print(f"  osfl run {done.override}", markup=False, highlight=False)
    return 0


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(text: str) -> int:
    """``--max-bytes``: a count of bytes, ``2G`` / ``500M`` / ``64K`` (binary
    units, an optional ``iB`` or ``B``) allowed."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit() or int(number) < 1:
        raise ConfigError(
            f"--max-bytes must be a positive byte count like 2G or 500M, got {text!r}"
        )
    return int(number) * _UNITS[unit]


def seconds(text: str) -> float:
    """``--timeout``: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {text!r}")
    return value


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
    get.add_argument(
        "--timeout",
        metavar="SECONDS",
        help=f"the longest one file's download may take (default {DEFAULT_TIMEOUT_S:g} s)",
    )
    get.add_argument(
        "--max-bytes",
        metavar="N",
        help=f"the most one file may hold, e.g. 2G (default {DEFAULT_MAX_BYTES >> 30} GiB)",
    )
    verbose_here(get)
    get.set_defaults(func=cmd_data_get)
    lst = dsub.add_parser("list", help="the datasets `osfl data get` knows, and which are cached")
    lst.add_argument("--cache", metavar="DIR", help=cache_help)
    verbose_here(lst)
    lst.set_defaults(func=cmd_data_list)
