"""Error types.

Every error a *user* can cause (a bad name, value or file) derives from
:class:`OsflError`; the CLI turns it into one clear line and exit status 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class OsflError(Exception):
    """A user-caused error: bad configuration, bad input file, unknown name.
    The CLI prints it as one line and exits with ``exit_status``."""

    exit_status = 2


class ConfigError(OsflError, ValueError):
    """A configuration value, name or key is invalid."""


class DataError(OsflError, ValueError):
    """A data source or partition cannot be built as asked."""


class UploadError(OsflError, ValueError):
    """An upload (or broadcast) failed validation.

    Names the client and the field so that the server log says exactly who sent
    what; the runtime can then drop that client and go on where the method allows.
    """

    def __init__(self, message: str, *, client: int | str | None = None, field: str | None = None):
        self.client = client
        self.field = field
        where = []
        if client is not None:
            where.append(f"client {client}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)
