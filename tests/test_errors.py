"""The error types (``osfl.errors``): every user-caused error is an
``OsflError`` with exit status 2 (the CLI's one line), the config and data
errors are also ``ValueError`` for callers that catch that, and an
``UploadError`` names the client and the field it refuses."""

from __future__ import annotations

import pytest

from osfl.errors import ConfigError, DataError, OsflError, UploadError


@pytest.mark.parametrize("kind", [ConfigError, DataError, UploadError])
def test_every_user_error_is_an_osfl_error_with_exit_status_2(kind: type[OsflError]) -> None:
    assert issubclass(kind, OsflError) and issubclass(kind, ValueError)
    assert kind("x").exit_status == 2
    assert not issubclass(RuntimeError, OsflError)  # a bug keeps its traceback


def test_an_upload_error_names_the_client_and_the_field() -> None:
    e = UploadError("shape (3,) != (4,)", client=7, field="w")
    assert str(e) == "[client 7, field 'w'] shape (3,) != (4,)"
    assert (e.client, e.field) == (7, "w")
    assert str(UploadError("too large", client="node-2")) == "[client node-2] too large"
    assert str(UploadError("bad", field="meta.n")) == "[field 'meta.n'] bad"
    assert str(UploadError("bare")) == "bare" and UploadError("bare").client is None
