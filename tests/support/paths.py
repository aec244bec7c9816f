"""Paths the tests read: the repository root and the fixture data."""

from __future__ import annotations

from pathlib import Path

#: the repository root (tests/support/paths.py is two levels below it)
ROOT = Path(__file__).resolve().parents[2]
#: reference values and old files the tests compare with (tests/fixtures/README.md)
FIXTURES = ROOT / "tests" / "fixtures"
