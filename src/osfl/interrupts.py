"""Ctrl-C while a run writes: the first stops the run cleanly, a second stops
the process at once, and neither leaves half a file.

The first SIGINT is Python's ``KeyboardInterrupt``: the round stops starting
clients, waits for the ones training (a thread cannot be stopped), and the
run directory says why. Waiting may take minutes, so a second SIGINT exits at
once with status 130 through ``os._exit``: the worker threads still in torch
are not joined and no interpreter or C++ teardown runs. Letting Python tear
down with those threads alive is what aborted the process before
(``terminate called without an active exception``, exit 134).

A write that must finish once started (a temporary file and its
``os.replace``, an event line, a plot) runs in :func:`atomic_section`: an
interrupt that arrives during one waits for its end, so a file is either the
old one or the new one, never half of one. ``metrics.json`` is rewritten
after every finished record, so a run stopped either way is resumed with
``osfl run --resume DIR``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

#: The exit status of a run stopped by Ctrl-C (128 + SIGINT), either way.
INTERRUPTED = 130

_lock = threading.RLock()  # reentrant: the handler may run while the main thread holds it
_open = 0  # writes in progress, every thread
_main_open = 0  # of them, the main thread's (where KeyboardInterrupt is raised)
_pending_raise = False  # a first Ctrl-C came during a main-thread write
_exit_pending = False  # a second Ctrl-C came during a write
_count = 0  # Ctrl-Cs since the policy was installed
_installed = 0  # nesting of :func:`sigint_policy` (osfl suite runs commands through main)
_on_exit: list[Callable[[], None]] = []

FIRST = (
    "osfl: stopping: clients already training finish first, then the run stops "
    "(Ctrl-C again to stop at once; either way `osfl run --resume DIR` finishes it)"
)
SECOND = "osfl: interrupted again: stopped at once"


def _is_main() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def atomic_section() -> Iterator[None]:
    """Around a write that must not be cut: Ctrl-C during it takes effect
    when it ends (the first raises ``KeyboardInterrupt`` in the main thread
    then, a second exits then)."""
    global _open, _main_open, _pending_raise
    main = _is_main()
    with _lock:
        _open += 1
        _main_open += main
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            _main_open -= main
            exit_now = _exit_pending and _open == 0
            raise_now = main and _main_open == 0 and _pending_raise
            if raise_now:
                _pending_raise = False
        if exit_now:
            exit_at_once()
        if raise_now:
            raise KeyboardInterrupt


def on_exit_at_once(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` (say why, in the run directory) just before a second
    Ctrl-C ends the process; returns a function that removes it."""
    with _lock:
        _on_exit.append(callback)

    def remove() -> None:
        with _lock, contextlib.suppress(ValueError):
            _on_exit.remove(callback)

    return remove


def exit_at_once() -> None:
    """End the process now with status 130: no thread joined, no teardown."""
    global _exit_pending
    with _lock:
        _exit_pending = False  # the callbacks' own writes must not start this again
        callbacks = list(_on_exit)
        _on_exit.clear()
    for callback in callbacks:
        with contextlib.suppress(Exception):
            callback()
    with contextlib.suppress(Exception):
        print(SECOND, file=sys.stderr, flush=True)
        sys.stdout.flush()
    os._exit(INTERRUPTED)


def _handler(signum: int, frame: FrameType | None) -> None:
    """SIGINT: the first raises ``KeyboardInterrupt`` (after a write in
    progress in the main thread), the next ends the process (after every
    write in progress)."""
    global _count, _pending_raise, _exit_pending
    with _lock:
        _count += 1
        first = _count == 1
        if first:
            print(FIRST, file=sys.stderr, flush=True)
            if _main_open:
                _pending_raise = True
                return
        elif _open:
            _exit_pending = True
            return
    if first:
        raise KeyboardInterrupt
    exit_at_once()


@contextlib.contextmanager
def sigint_policy() -> Iterator[None]:
    """Ctrl-C as this module says, for one command; outside the main thread
    (where no handler can be installed) nothing changes. A command stopped by
    Ctrl-C leaves the handler in place: the process is ending, and a second
    Ctrl-C while Python waits for the last threads must still exit at once."""
    global _installed, _count, _pending_raise, _exit_pending
    if not _is_main():
        yield
        return
    with _lock:
        if _installed == 0:
            _count, _pending_raise, _exit_pending = 0, False, False
        _installed += 1
    previous = signal.signal(signal.SIGINT, _handler)
    stopped = False
    try:
        yield
    except KeyboardInterrupt:
        stopped = _count > 0  # a real Ctrl-C (a test may raise one by hand)
        raise
    finally:
        with _lock:
            _installed -= 1
        if not stopped:
            signal.signal(signal.SIGINT, previous)
