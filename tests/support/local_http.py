"""A static HTTP server on 127.0.0.1 for the download tests: nothing leaves
the machine, and proxies and the ``OSFL_DATA_*`` variables of the shell that
runs the tests are out of the way."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no request lines in the output
        pass


@contextlib.contextmanager
def serving(
    www: Path,
    monkeypatch: pytest.MonkeyPatch,
    handler: type[SimpleHTTPRequestHandler] | None = None,
) -> Iterator[str]:
    """Serve folder ``www`` (with ``handler``, a hostile server's, when given);
    yields the base URL (``http://127.0.0.1:PORT``)."""
    for var in ("OSFL_DATA_CACHE", "OSFL_DATA_MIRROR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    cls = handler or _Quiet
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(cls, directory=str(www)))
    httpd.daemon_threads = True  # a trickling handler must not hold up the shutdown
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
