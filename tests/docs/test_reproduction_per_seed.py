"""REPRODUCTION.md's mean ± std rows against the per-seed values kept under
``reproduction/``: every group of per-seed accuracies in those files appears
in REPRODUCTION.md as its mean ± sample std (to the printed precision), and
every file is named there. A row edited by hand, or a file re-made from other
runs without updating the page, fails here."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT

PAGE = (ROOT / "REPRODUCTION.md").read_text()
FILES = sorted((ROOT / "reproduction").glob("*.json"))
#: Every "mean ± std" the page prints, with the number of decimals of each.
PRINTED = [
    (float(m), float(s), len(m.partition(".")[2]))
    for m, s in re.findall(r"(-?\d+\.\d+) ± (\d+\.\d+)", PAGE)
]


def seed_groups(tree: Any) -> Iterator[list[float]]:
    """Each mapping of seed number -> accuracy with two or more seeds."""
    if isinstance(tree, dict):
        if len(tree) > 1 and all(
            k.isdigit() and isinstance(v, int | float) for k, v in tree.items()
        ):
            yield [float(v) for v in tree.values()]
            return
        for v in tree.values():
            yield from seed_groups(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from seed_groups(v)


def printed(mean: float, std: float) -> bool:
    """Whether the page prints this mean ± std at its precision (values kept to
    4 decimals may move a half-way case by one unit of the last printed digit)."""
    return any(
        abs(m - mean) <= 0.5 * 10**-d + 1e-4 and abs(s - std) <= 0.5 * 10**-d + 1e-4
        for m, s, d in PRINTED
    )


def test_there_are_per_seed_files() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_file_is_named_in_reproduction(path: Path) -> None:
    assert f"reproduction/{path.name}" in PAGE


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_group_of_seeds_is_a_printed_row(path: Path) -> None:
    groups = list(seed_groups(json.loads(path.read_text())))
    missing = [
        (round(statistics.mean(g), 2), round(statistics.stdev(g), 2), g)
        for g in groups
        if not printed(statistics.mean(g), statistics.stdev(g))
    ]
    assert not missing, f"{path.name}: not printed in REPRODUCTION.md: {missing[:5]}"


def test_a_changed_value_is_caught() -> None:
    """The check itself: shifting one seed by a point leaves the row unprinted."""
    assert printed(25.6833, 1.8817)  # IntactOFL's Ensemble at α = 0.1
    assert not printed(statistics.mean([25.2, 25.05, 27.8]), statistics.stdev([25.2, 25.05, 27.8]))


def test_table_rows_keep_their_own_mean_and_std() -> None:
    """Files written by ``osfl table --per-seed`` carry mean and std: they equal
    the per-seed values' own."""
    for path in FILES:
        rows = json.loads(path.read_text())
        if not (isinstance(rows, list) and rows and "accuracy" in rows[0]):
            continue
        for row in rows:
            values = list(row["accuracy"].values())
            assert row["mean"] == pytest.approx(statistics.mean(values), abs=1e-4)
            if len(values) > 1:
                assert row["std"] == pytest.approx(statistics.stdev(values), abs=1e-4)


def test_every_section_has_a_rerun_status_row() -> None:
    """The "Re-run status" table names every section of the page (its first
    cell is the section's heading), so a new section states its re-run."""
    sections = re.findall(r"^## (.+)$", PAGE, flags=re.M)
    assert sections[0] == "Re-run status"
    table = PAGE.split("## Re-run status", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| section")]  # fmt: skip
    assert rows == sections[1:]


def test_every_section_names_its_machine() -> None:
    """Issue "The README's two commands pass on any clean machine": each
    section's row names the CPU fingerprint its numbers were made on, or says
    that none was recorded; the page's intro names every fingerprint it uses."""
    table = PAGE.split("## Re-run status", 1)[1].split("\n## ", 1)[0]
    rows = [
        line.split(" | ")
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| section")
    ]
    assert rows, "no Re-run status rows"
    intro = PAGE.split("## Re-run status", 1)[0]
    for cells in rows:
        machine = cells[1]
        ids = re.findall(r"`([0-9a-f]{12})`", machine)
        assert ids or "not re-run on a fingerprinted machine" in machine, cells[0]
        assert all(i in intro for i in ids), (cells[0], ids)


#: Words that mark a printed mean ± std as someone else's or an earlier run's
#: (a paper's number, a table printed before a re-run): such values are quoted
#: for comparison and have no per-seed file to back them.
CONTEXT_WORDS = ("paper", "earlier", "before")


def table_header(lines: list[str], row: int) -> list[str] | None:
    """The header cells of the Markdown table that line ``row`` belongs to."""
    if not lines[row].startswith("|"):
        return None
    i = row
    while i > 0 and lines[i - 1].startswith("|"):
        i -= 1
    return [c.strip() for c in lines[i].strip("|").split("|")]


def is_context(lines: list[str], row: int, start: int) -> bool:
    """Whether the value starting at column ``start`` of line ``row`` is a
    quoted one: its line (or, in a table, its column's header) says so, or it
    is bracketed as an earlier measurement ``(m ± s)``."""
    line = lines[row]
    header = table_header(lines, row)
    if header is None:
        text = line
    else:
        column = line[:start].count("|") - 1
        text = header[column] if 0 <= column < len(header) else ""
        text += " " + line.split("|")[1]  # the row's own label ("paper (CIFAR-10 ...)")
    if any(w in text.lower() for w in CONTEXT_WORDS):
        return True
    return start > 0 and line[start - 1] == "("


def backed(mean: float, std: float, decimals: int, groups: list[tuple[float, float]]) -> bool:
    tol = 0.5 * 10**-decimals + 1e-4
    return any(abs(m - mean) <= tol and abs(s - std) <= tol for m, s in groups)


def test_every_printed_mean_and_std_has_its_per_seed_values() -> None:
    """The converse of the checks above: every mean ± std the page prints is a
    group of per-seed values in some file under ``reproduction/``, unless it is
    quoted (a paper's number, an earlier run's, marked as such)."""
    groups = [
        (statistics.mean(g), statistics.stdev(g))
        for path in FILES
        for g in seed_groups(json.loads(path.read_text()))
    ]
    lines = PAGE.splitlines()
    unbacked = [
        (n + 1, match.group(0))
        for n, line in enumerate(lines)
        for match in re.finditer(r"(-?\d+\.\d+) ± (\d+\.\d+)", line)
        if not backed(float(match[1]), float(match[2]), len(match[1].partition(".")[2]), groups)
        and not is_context(lines, n, match.start())
    ]
    assert not unbacked, f"mean ± std without per-seed values (line, value): {unbacked}"


def test_a_quoted_value_needs_its_marker() -> None:
    lines = [
        "| method | ours | paper |",
        "|---|---:|---:|",
        "| FedAvg | 19.8 ± 2.6 | 21.0 ± 1.0 |",
        "the earlier run printed 32.38 ± 2.23",
        "our run gave 32.38 ± 2.23",
        "| x | 18.1 ± 2.3 (19.8 ± 2.2) |",
    ]
    assert not is_context(lines, 2, lines[2].index("19.8"))
    assert is_context(lines, 2, lines[2].index("21.0"))
    assert is_context(lines, 3, lines[3].index("32.38"))
    assert not is_context(lines, 4, lines[4].index("32.38"))
    assert not is_context(lines, 5, lines[5].index("18.1"))
    assert is_context(lines, 5, lines[5].index("19.8"))
