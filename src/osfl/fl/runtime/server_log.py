"""What the server's step says: warnings logged while it aggregates, kept for the record.

A server rule may change what it was asked to do and say so only in the log:
Krum scoring with a smaller f than ``server.byzantine`` because too few
uploads arrived (``fl/aggregators.py::krum_tolerance``), a method falling
back to another rule. A log line scrolls away; the record is what a reader
of the results has (issue "Hostile peers and damaged files, round three").
So the round loop listens while it aggregates and puts every WARNING that an
``osfl`` logger emits on its thread into the round's ``server_warnings``,
which the record's ``warnings`` list then holds ("server (round r): ...").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: the logger tree whose warnings are kept (every osfl module logs under it)
OSFL_LOGGER = "osfl"


class _Collector(logging.Handler):
    """Keeps the messages of WARNING records from one thread."""

    def __init__(self, thread: int):
        super().__init__(level=logging.WARNING)
        self.thread = thread
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.messages.append(record.getMessage())


@contextmanager
def server_warnings() -> Iterator[list[str]]:
    """Collect the warnings osfl's loggers emit on this thread inside the
    block (other threads' ones, a client still training, are not the
    server's); yields the list they go into."""
    collector = _Collector(threading.get_ident())
    logger = logging.getLogger(OSFL_LOGGER)
    logger.addHandler(collector)
    try:
        yield collector.messages
    finally:
        logger.removeHandler(collector)
