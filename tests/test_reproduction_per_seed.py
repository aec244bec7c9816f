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

ROOT = Path(__file__).resolve().parents[1]
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
        if len(tree) > 1 and all(k.isdigit() and isinstance(v, int | float) for k, v in tree.items()):
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
