"""The CLI's refusal contract, read the one way every test reads it: exit
status 2 and exactly one line on stderr, ``osfl: error: ...``."""

from __future__ import annotations

import pytest

from osfl.cli import main


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``osfl ARGV``, expect a refusal, return its one stderr line
    (what earlier calls in the test printed is drained first)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("osfl: error: "), err
    return err[0]
