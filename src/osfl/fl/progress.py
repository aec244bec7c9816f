"""Progress bars for long loops: one board per run, many bars on it.

Local training, the rounds of a runtime and the phases of a server (synthesis,
distillation) all report to the :class:`Progress` their
:class:`~osfl.fl.context.RunContext` carries. The default is the silent board
(:class:`Progress` itself), so library code and tests draw nothing; ``osfl
run`` puts a :class:`RichProgress` there when its output is a terminal (one
live display for the whole run, so bars of thread-parallel clients and of
nested phases stack instead of fighting over the screen).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any


class ProgressTask:
    """One bar. The base class draws nothing; use it as a context manager so
    that the bar goes away when its loop ends, however it ends."""

    def advance(self, amount: float = 1.0, *, description: str | None = None) -> None:
        """Move the bar by ``amount``; ``description`` replaces its text."""

    def close(self) -> None:
        """Remove the bar."""

    def __enter__(self) -> ProgressTask:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Progress:
    """The silent board: every :meth:`task` is a no-op bar. A board is a
    context manager (a live display runs while it is entered)."""

    enabled: bool = False

    def task(self, description: str, total: float | None = None) -> ProgressTask:
        """A new bar of ``total`` units (``None``: unknown length)."""
        return ProgressTask()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _RichTask(ProgressTask):
    def __init__(self, board: Any, description: str, total: float | None):
        self._board = board
        self._id = board.add_task(description, total=total)
        self._closed = False

    def advance(self, amount: float = 1.0, *, description: str | None = None) -> None:
        if description is None:
            self._board.update(self._id, advance=amount)
        else:
            self._board.update(self._id, advance=amount, description=description)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._board.remove_task(self._id)


class RichProgress(Progress):
    """A rich live display with a bar, count, elapsed time and time left per task.

    Start it once for a whole run (``with RichProgress(console): ...``); rich
    serialises updates from several threads, and logging through rich's
    handler on the same console prints above the bars.
    """

    enabled = True

    def __init__(self, console: Any = None):
        # heavy: rich.progress (~50 ms; keeps osfl.fl.progress light for the CLI)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichBoard  # heavy: rich.progress

        self._board = RichBoard(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )

    def task(self, description: str, total: float | None = None) -> ProgressTask:
        return _RichTask(self._board, description, total)

    def __enter__(self) -> RichProgress:
        self._board.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._board.stop()
