"""Every method page names the public code it was compared with (by commit,
or says there is none) and lists its departures; every registered method is
mentioned by some method page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.paths import ROOT

PAGES = sorted((ROOT / "docs" / "methods").glob("*.md"))

COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def _section(text: str, heading: str) -> str:
    """The lines under ``heading`` up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    out = []
    for line in lines[start:]:
        m = re.match(r"(#+) ", line)
        if m and len(m.group(1)) <= level:
            break
        out.append(line)
    return "\n".join(out)


def test_there_are_method_pages() -> None:
    assert len(PAGES) >= 10


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name) for p in PAGES])
def test_page_names_the_code_compared_with(page: Path) -> None:
    lines = [ln for ln in page.read_text(encoding="utf-8").splitlines() if "Compared with:" in ln]
    assert lines, f"{page.name}: no 'Compared with:' line"
    for line in lines:
        tail = line.split("Compared with:", 1)[1]
        assert COMMIT.search(tail) or "no public code" in tail.lower(), (
            f"{page.name}: {line.strip()!r} names neither a commit nor 'no public code'"
        )


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name) for p in PAGES])
def test_page_lists_its_departures(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "### Departures" in text.splitlines(), f"{page.name}: no '### Departures' heading"
    bullets = [
        ln for ln in _section(text, "### Departures").splitlines() if re.match(r"\s*[-*] \S", ln)
    ]
    assert bullets, f"{page.name}: '### Departures' has no bullet"


def test_every_registered_method_is_mentioned_by_a_method_page() -> None:
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.fl.method import METHODS

    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    own = [name for name in METHODS.names() if METHODS.origin(name) is None]  # not plugins'
    missing = [name for name in own if f"`{name}`" not in text]
    assert not missing, (
        f"method(s) {', '.join(map(repr, missing))} have no docs/methods page naming them "
        "(in backticks, e.g. `vote`)"
    )
