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


def _block(check, info: str, elsewhere: str | None = "fedavg ±3, ensemble ±1"):
    parsed = check.Elsewhere.parse(elsewhere) if elsewhere is not None else None
    return check.Block(ROOT / "README.md", 0, 1, 2, "osfl run", None, info, None, parsed)


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


ELSEWHERE = "recorded on torch 2.13.0+cpu, aten AVX512, fingerprint 000000000000"


def test_another_machine_is_checked_within_each_rows_tolerance() -> None:
    """Elsewhere every line keeps its shape, integers and sizes stay equal,
    and each decimal may move by at most its own row's tolerance: FedAvg's
    ±3 does not stretch to the Ensemble's ±1."""
    check = _checker()
    here = check.machine()
    block = _block(check, ELSEWHERE)
    moved = TABLE.replace("53.66", "51.44").replace("85.14", "86.10")
    assert check.judge(block, TABLE, moved, here, None)  # 2.22 and 0.96 points
    missing, moves = check.differences_within(TABLE, moved, block.elsewhere)
    assert missing == [] and check.largest_move(moves) == pytest.approx(2.22)
    assert moves[0].endswith("53.66 -> 51.44 (±3)") and moves[1].endswith("(±1)")
    assert check.judge(block, TABLE, TABLE.replace("53.66", "50.66"), here, None)  # 3.00: the edge
    assert not check.judge(block, TABLE, TABLE.replace("53.66", "50.65"), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("85.14", "86.15"), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("482.5 KiB", "482.6 KiB", 1), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("│     1 │", "│     2 │", 1), here, None)
    assert not check.judge(block, TABLE, TABLE.replace("ensemble", "fedprox"), here, None)
    assert check.judge(block, TABLE, TABLE.replace("53.66", "49.00"), here, 5.0)  # --tolerance
    assert not check.judge(_block(check, block.info, None), TABLE, moved, here, None)


def test_a_row_the_marker_does_not_name_is_exact_and_any_checks_only_the_words() -> None:
    check = _checker()
    here = check.machine()
    fedavg_only = _block(check, ELSEWHERE, "fedavg ±3")
    assert not check.judge(fedavg_only, TABLE, TABLE.replace("85.14", "85.15"), here, None)
    loose = _block(check, ELSEWHERE, "fedavg ±3, ensemble any")
    assert check.judge(loose, TABLE, TABLE.replace("85.14", "12.00"), here, None)
    assert not check.judge(
        loose, TABLE, TABLE.replace("85.14 │ 482.5", "85.14 │ 482.6"), here, None
    )
    exact = _block(check, ELSEWHERE, "exact")
    assert check.judge(exact, TABLE, TABLE.replace("0.3 │", "9.3 │"), here, None)  # a time
    assert not check.judge(exact, TABLE, TABLE.replace("53.66", "53.67"), here, None)


SWEEP = """\
| setting | method | seeds | accuracy (%) | bytes up | time (s) |
|---|---|---:|---:|---:|---:|
| partition.alpha=0.1 | fedavg | 2 | 24.83 ± 10.03 | 482.5 KiB | 6.4 |
| partition.alpha=1.0 | fedavg | 2 | 82.48 ± 2.20 | 482.5 KiB | 3.3 |
"""


def test_a_row_may_give_its_mean_and_its_std_their_own_tolerances() -> None:
    check = _checker()
    here = check.machine()
    block = _block(check, ELSEWHERE, "partition.alpha=0.1 fedavg ±1.5/±1.2, partition.alpha=1.0 ±1")
    assert check.judge(block, SWEEP, SWEEP.replace("10.03", "11.13"), here, None)
    assert not check.judge(block, SWEEP, SWEEP.replace("10.03", "11.33"), here, None)
    assert not check.judge(block, SWEEP, SWEEP.replace("24.83", "26.43"), here, None)
    assert check.judge(block, SWEEP, SWEEP.replace("2.20", "1.20"), here, None)


def test_a_marker_that_does_not_fit_its_block_fails(tmp_path) -> None:
    """A mistyped row, a line two rows name, a count of tolerances that is
    not the line's: the check fails instead of passing unchecked numbers;
    an unreadable tolerance stops the checker with one line."""
    check = _checker()
    here = check.machine()
    for elsewhere in ("fedavg ±3, ensmble ±1", "fedavg ±3, 1 ±1", "fedavg ±3/±2"):
        assert not check.judge(_block(check, ELSEWHERE, elsewhere), TABLE, TABLE, here, None)
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doccheck: echo hi | recorded on x | elsewhere fedavg 3 -->\n```\nhi\n```\n"
    )
    with pytest.raises(SystemExit, match=r"doc\.md:1: '3' is not a tolerance"):
        check.blocks(doc)


def test_every_marker_names_its_fingerprint_and_tolerances_that_fit_its_block() -> None:
    check = _checker()
    for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]:
        lines = path.read_text().splitlines()
        for b in check.blocks(path):
            where = f"{path.name}:{b.marker_line + 1}"
            assert check.recorded_fingerprint(b.info), where
            assert b.elsewhere is not None and b.elsewhere.everything is None, where
            documented = "\n".join(lines[b.start : b.end])
            assert b.elsewhere.unused(documented) == [], where
            for line in check.mask(documented):
                b.elsewhere.for_line(line)  # raises where two rows name one line


def test_an_update_records_this_machine_and_keeps_the_tolerances(tmp_path) -> None:
    check = _checker()
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doccheck: echo hi | recorded on an old machine | elsewhere hi ±2.5, ho any -->\n"
        "```\nho\n```\n"
    )
    (block,) = check.blocks(doc)
    assert (
        block.elsewhere.text() == "hi ±2.5, ho any" and block.info == "recorded on an old machine"
    )
    check.update(block, "hi\n")
    (again,) = check.blocks(doc)
    assert again.elsewhere == block.elsewhere and again.info == f"recorded on {check.machine()}"
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
