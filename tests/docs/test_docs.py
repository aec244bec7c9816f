"""The outputs printed in README.md and docs/ are checkable: the checker
(``scripts/check_docs.py``) masks only machine-dependent numbers, and (slow)
every marked command still prints what the docs show."""

from __future__ import annotations

import pytest

from support.paths import ROOT
from support.scripts import load_script


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


def test_a_summarys_wall_time_is_masked() -> None:
    """summary.md's "wall time 32.9 s" is the machine's load, not the code's."""
    check = _checker()
    line = "- seeds [0, 1]; wall time 32.9 s\n"
    assert check.missing_lines(line, line.replace("32.9", "41.0")) == []
    assert check.missing_lines(line, line.replace("[0, 1]", "[0, 2]")) != []


def test_times_are_masked_below_a_rich_rule_line() -> None:
    """rich draws a rule (┡━━╇━┩) between the header and the rows: the time
    column found in the header still applies to the rows below it."""
    check = _checker()
    ruled = TABLE.replace(
        "│ fedavg", "┡━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━┩\n│ fedavg", 1
    )
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


def _block(check, info: str, tolerance: float | None = 3.0):
    return check.Block(ROOT / "README.md", 0, 1, 2, "osfl run", None, info, None, tolerance)


def test_the_recorded_machine_is_checked_exactly() -> None:
    """Where the fingerprint is the recorded one, a number that no longer
    re-runs is a failure, however small the move."""
    check = _checker()
    here = check.machine()
    block = _block(check, f"recorded on {here}")
    assert check.judge(block, TABLE, TABLE, here, None)
    assert not check.judge(block, TABLE, TABLE.replace("85.14", "85.15"), here, None)


def test_a_machine_found_exact_on_a_rerun_is_checked_exactly_too() -> None:
    """``exact also on ID``: a machine whose re-run gave every documented line
    stays under the exact check (a one-digit move fails there); a machine not
    named keeps the tolerance."""
    check = _checker()
    here = check.machine()
    mine = check.recorded_fingerprint(here)
    info = f"recorded on torch, fingerprint 000000000000; exact also on 111111111111, {mine}"
    assert check.exact_fingerprints(info) == {"000000000000", "111111111111", mine}
    moved = TABLE.replace("85.14", "85.15")
    assert not check.judge(_block(check, info), TABLE, moved, here, None)
    other = "recorded on torch, fingerprint 000000000000; exact also on 111111111111"
    assert check.judge(_block(check, other), TABLE, moved, here, None)


def test_another_machine_is_checked_within_the_blocks_tolerance() -> None:
    """Elsewhere every line keeps its shape, integers and sizes stay equal,
    and a decimal may move by at most the marker's tolerance."""
    check = _checker()
    here = check.machine()
    block = _block(check, "recorded on torch 2.13.0+cpu, aten AVX512, fingerprint 000000000000")
    moved = TABLE.replace("53.66", "51.44").replace("85.14", "86.10")
    assert check.judge(block, TABLE, moved, here, None)  # 2.22 and 0.96 points: within 3
    missing, moves = check.differences_within(TABLE, moved, 3.0)
    assert missing == [] and check.largest_move(moves) == pytest.approx(2.22)
    assert not check.judge(block, TABLE, TABLE.replace("53.66", "49.00"), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("482.5 KiB", "482.6 KiB", 1), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("│     1 │", "│     2 │", 1), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("ensemble", "fedprox"), here, None)
    assert check.judge(block, TABLE, TABLE.replace("53.66", "49.00"), here, 5.0)  # --tolerance
    assert not check.judge(_block(check, block.info, None), TABLE, moved, here, None)


def test_every_marker_names_its_fingerprint_and_a_tolerance() -> None:
    check = _checker()
    for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]:
        for b in check.blocks(path):
            assert check.recorded_fingerprint(b.info), f"{path.name}:{b.marker_line + 1}"
            assert b.tolerance is not None and b.tolerance > 0, f"{path.name}:{b.marker_line + 1}"


def test_an_update_records_this_machine_and_keeps_the_tolerance(tmp_path) -> None:
    check = _checker()
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doccheck: echo hi | recorded on an old machine | elsewhere ±2.5 -->\n```\nho\n```\n"
    )
    (block,) = check.blocks(doc)
    assert block.tolerance == 2.5 and block.info == "recorded on an old machine"
    check.update(block, "hi\n")
    (again,) = check.blocks(doc)
    assert again.tolerance == 2.5 and again.info == f"recorded on {check.machine()}"
    assert doc.read_text().splitlines()[2] == "hi"


#: Kernel paths below this machine's (any x86-64 machine of the README's
#: set-up reaches them): the default run's block must pass under each.
LOWER_PATHS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"},
}


@pytest.mark.parametrize("level", sorted(LOWER_PATHS))
def test_the_default_block_passes_on_a_lower_kernel_path(level: str) -> None:
    """The README's default run on another kernel path (another fingerprint):
    its numbers move, within the block's stated tolerance, and the checker
    passes and prints them (what a clean machine of another CPU kind sees)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **LOWER_PATHS[level]}
    argv = [
        sys.executable,
        "scripts/check_docs.py",
        "README.md",
        "-k",
        "osfl run --no-progress --out",
    ]
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "another machine" in proc.stdout and "fingerprint" in proc.stdout


def test_the_checker_takes_a_relative_path(monkeypatch) -> None:
    monkeypatch.chdir(ROOT / "docs")
    # the path resolves (no error reading it); a -k that matches no block exits 2
    assert _checker().main(["../README.md", "-k", "no block has this command"]) == 2
