"""Every link between the docs resolves: the file exists and, for ``#anchor``,
a heading of that file has that GitHub anchor."""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation
    dropped, spaces to hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", text)
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            out += LINK.findall(line)
    return out


def test_every_relative_link_and_anchor_in_the_docs_resolves() -> None:
    broken = []
    for md in [ROOT / "README.md", *ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md")]:
        for target in links(md):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (md.parent / file).resolve() if file else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
