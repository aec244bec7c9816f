"""The outputs printed in README.md and docs/ are checkable: the checker
(``scripts/check_docs.py``) masks only machine-dependent numbers, and (slow)
every marked command still prints what the docs show."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    return load_script("scripts/check_docs.py")


TABLE = """\
┃ method   ┃ seeds ┃ accuracy (%) ┃  bytes up ┃ time (s) ┃
│ fedavg   │     1 │        53.66 │ 482.5 KiB │      0.3 │
│ ensemble │     1 │        85.14 │ 482.5 KiB │      0.6 │
run directory: /tmp/x  (49.5 s)
"""


def test_times_and_paths_are_masked_but_accuracies_are_not() -> None:
    check = _checker()
    slower = TABLE.replace("0.3 │", "12.9 │").replace("(49.5 s)", "(301.0 s)")
    slower = slower.replace("/tmp/x", "/tmp/elsewhere")
    assert check.missing_lines(TABLE, slower) == []
    other = TABLE.replace("85.14", "85.15")
    assert check.missing_lines(TABLE, other) == ["│ ensemble │ 1 │ 85.14 │ 482.5 KiB │ ~ │"]


def test_times_are_masked_below_a_rich_rule_line() -> None:
    """rich draws a rule (┡━━╇━┩) between the header and the rows: the time
    column found in the header still applies to the rows below it."""
    check = _checker()
    ruled = TABLE.replace("│ fedavg", "┡━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━┩\n│ fedavg", 1)
    slower = ruled.replace("0.3 │", "21.0 │")
    assert check.missing_lines(ruled, slower) == []


def test_a_documented_excerpt_must_appear_in_order() -> None:
    check = _checker()
    excerpt = "│ ensemble │     1 │        85.14 │ 482.5 KiB │      0.6 │\n"
    assert check.missing_lines(excerpt, TABLE) == []
    assert check.missing_lines("markdown | line | 1 |\n", TABLE) == ["markdown | line | 1 |"]


def test_a_warning_the_docs_do_not_show_is_a_difference() -> None:
    check = _checker()
    warned = TABLE + "warning fedavg: client 0 (round 0): did not fit its own data\n"
    assert check.missing_lines(TABLE, warned) == []  # an excerpt...
    assert check.unexpected_warnings(TABLE, warned) == [  # ...but no new warning
        "warning fedavg: client 0 (round 0): did not fit its own data"
    ]
    assert check.unexpected_warnings(warned, warned) == []  # a documented warning is fine


def test_every_marker_is_followed_by_an_output_block() -> None:
    check = _checker()
    found = [b for f in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")] for b in check.blocks(f)]
    assert len(found) >= 5
    for b in found:
        assert b.start <= b.end and b.command
        assert (b.code is not None) == (b.command == "python")


@pytest.mark.slow
def test_documented_outputs_match_fresh_runs() -> None:
    """Runs every marked command (several minutes)."""
    assert _checker().main([]) == 0


#: The README blocks cheap enough for the fast suite (about a minute together):
#: the default run, the Python example and the privacy audit. The sweep and the
#: docs/ pages' blocks run in the slow test above.
CHEAP = ("osfl run --no-progress --out", "python", "osfl audit")


@pytest.mark.parametrize("keyword", CHEAP)
def test_the_cheap_documented_outputs_match_fresh_runs(keyword: str) -> None:
    """What README.md prints for these commands is what they print now, on
    the README's own terms (its commands, as written; machine-dependent times
    and paths masked; a different CPU kernel path is reported, not failed)."""
    check = _checker()
    assert len([b for b in check.blocks(ROOT / "README.md") if keyword in b.command]) == 1
    assert check.main(["README.md", "-k", keyword]) == 0


def test_the_checker_takes_a_relative_path(monkeypatch) -> None:
    monkeypatch.chdir(ROOT / "docs")
    assert _checker().main(["../README.md", "-k", "no block has this command"]) == 0
