"""A number the docs quote from REPRODUCTION.md is the number REPRODUCTION.md
holds now.

A docs paragraph (or list item) that cites ``REPRODUCTION.md, "Section"``
takes its figures from that section; when the section is re-run and its
numbers move, a page that still quotes the old run misleads a reader who
never opens REPRODUCTION (the review behind issue 42 found a page quoting a
FAFI run two re-runs old). So every decimal number in such a paragraph must
occur in one of the sections it names. A figure that is not copied but
derived (a difference of two table cells, a count) is listed in
:data:`DERIVED` with where it comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from support.paths import ROOT

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#+)[ \t]+(.+)$")
#: a decimal number standing alone (not part of a version, a hash or a path)
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\w)")
#: a mean ± std
PAIR = re.compile(r"(?<![\w.])(\d+\.\d+) ± (\d+\.\d+)(?![\w.]*\w)")
#: a paragraph's label line, cited like a heading ("How to read the numbers:")
LABEL = re.compile(r"^[A-Z][\w ,'-]*:$")
QUOTED = re.compile(r"[\"“]([^\"”]+)[\"”]")

#: (doc path, number) -> why the number is not copied from the cited section
DERIVED: dict[tuple[str, str], str] = {
    ("docs/gpu-suite.md", "26.1"): "the MFU step's own output (BENCHMARKS.md), not a row",
    ("docs/gpu-suite.md", "5.1"): "the MFU step's own output (BENCHMARKS.md), not a row",
    **{
        ("docs/methods/kd.md", n): "the page's own table before and after 2026-11-27; "
        "the citation names the machine only"
        for n in ("4.9", "71.84", "76.72")
    },
}


@dataclass(frozen=True)
class Section:
    level: int
    title: str
    text: str


def unfenced_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a ``# comment`` in a bash block is
    not a heading, and a command's numbers are not quoted figures)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def sections(text: str) -> list[Section]:
    """Every heading's section: its text up to the next heading of the same or
    a higher level (subsections included)."""
    lines = unfenced_lines(text)
    heads = [
        (i, len(m.group(1)), m.group(2).strip())
        for i, line in enumerate(lines)
        if (m := HEADING.match(line))
    ]
    out = []
    for k, (start, level, title) in enumerate(heads):
        end = next((i for i, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out.append(Section(level, title, "\n".join(lines[start:end])))
    for i, line in enumerate(lines):  # a label line ("How to read the numbers:")
        if LABEL.match(line):
            end = next((h for h, _, _ in heads if h > i), len(lines))
            out.append(Section(99, line.rstrip(":"), "\n".join(lines[i:end])))
    return out


def find_section(secs: list[Section], title: str) -> Section | None:
    """The section a citation names: its exact title, else the one title that
    starts with it (citations drop a heading's parenthesised scale)."""
    title = " ".join(title.split())
    exact = [s for s in secs if s.title == title]
    if exact:
        return exact[0]
    prefix = [s for s in secs if s.title.startswith(title)]
    return prefix[0] if len(prefix) == 1 else None


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, with each list item a block of its own;
    HTML comments (doccheck markers) removed."""
    body = "\n".join(unfenced_lines(re.sub(r"<!--.*?-->", "", text, flags=re.S)))
    return [p for p in re.split(r"\n\s*\n|\n(?=\s*[-*] )", body) if p.strip()]


def cited_titles(paragraph: str) -> list[str]:
    """The quoted section titles that follow each ``REPRODUCTION.md`` of a
    paragraph, up to the parenthesis that closes the citation."""
    titles = []
    for m in re.finditer(r"REPRODUCTION\.md", paragraph):
        tail = paragraph[m.end() :]
        close = tail.find(")")
        titles += QUOTED.findall(tail if close < 0 else tail[:close])
    return titles


def quotes(number: str, held: set[str]) -> bool:
    """``number`` is one of ``held``, or one of them rounded to its places
    (a page may quote 27.13 ± 1.70 as 27.1 ± 1.7)."""
    places = len(number.split(".")[1])
    step = Decimal(1).scaleb(-places)
    return number in held or any(
        len(h.split(".")[1]) > places
        and Decimal(h).quantize(step, rounding=ROUND_HALF_UP) == Decimal(number)
        for h in held
    )


def stale_numbers(doc: str, reproduction: str, where: str = "") -> list[str]:
    """Every number of ``doc`` that a citing paragraph quotes and the cited
    sections of ``reproduction`` do not hold, as readable lines."""
    secs = sections(reproduction)
    problems = []
    introduced: list[str] = []  # a citing paragraph ending in ":" introduces the next block
    for para in paragraphs(doc):
        titles = cited_titles(para) or introduced
        introduced = titles if para.rstrip().endswith(":") else []
        if not titles:
            continue
        found = [find_section(secs, t) for t in titles]
        for title, sec in zip(titles, found, strict=True):
            if sec is None:
                problems.append(f'{where}: cites "{title}", which is no section of REPRODUCTION.md')
        held = "\n".join(s.text for s in found if s is not None)
        held_pairs = set(PAIR.findall(held))
        for pair in PAIR.findall(para):  # a mean ± std is quoted as a pair
            if not any(quotes(pair[0], {h[0]}) and quotes(pair[1], {h[1]}) for h in held_pairs):
                problems.append(f"{where}: {pair[0]} ± {pair[1]} is not in {titles}")
        held_numbers = set(NUMBER.findall(held))
        for number in NUMBER.findall(PAIR.sub(" ", para)):
            if not quotes(number, held_numbers) and (where, number) not in DERIVED:
                first = " ".join(para.split())[:90]
                problems.append(f"{where}: {number} is not in {titles} (paragraph: {first}...)")
    return problems


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", doc_paths(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_number_quoted_from_reproduction_is_the_number_there(path: Path) -> None:
    reproduction = (ROOT / "REPRODUCTION.md").read_text()
    where = str(path.relative_to(ROOT))
    assert stale_numbers(path.read_text(), reproduction, where) == []


REPRODUCTION_STUB = """\
# Results

## FAFI (cpu scale)

| fusion | accuracy |
|---|---:|
| median | 64.2 ± 2.6 |

```bash
# not a heading
osfl run --sweep alpha=0.5
```

## Other

Elsewhere: 80.5.
"""


def test_a_stale_quote_is_named() -> None:
    doc = 'The median keeps FAFI at 80.5 % (REPRODUCTION.md, "FAFI").\n'
    problems = stale_numbers(doc, REPRODUCTION_STUB, "x.md")
    assert len(problems) == 1 and "80.5" in problems[0]


def test_a_current_quote_passes_and_a_code_comment_is_no_heading() -> None:
    doc = 'The median keeps FAFI at 64.2 ± 2.6 % (REPRODUCTION.md, "FAFI").\n'
    assert stale_numbers(doc, REPRODUCTION_STUB, "x.md") == []
    assert [s.title for s in sections(REPRODUCTION_STUB)] == [
        "Results",
        "FAFI (cpu scale)",
        "Other",
    ]


def test_a_mean_and_std_are_checked_as_one_pair() -> None:
    stub = "## FAFI\n\n| a | 27.13 ± 1.70 |\n| b | 30.00 ± 4.00 |\n"
    assert stale_numbers('27.13 ± 1.70 (REPRODUCTION.md, "FAFI")', stub, "x.md") == []
    assert len(stale_numbers('27.13 ± 4.00 (REPRODUCTION.md, "FAFI")', stub, "x.md")) == 1


def test_a_rounded_quote_passes_and_a_misrounded_one_does_not() -> None:
    stub = "## FAFI\n\n| a | 27.13 ± 1.70 |\n"
    assert stale_numbers('27.1 ± 1.7 (REPRODUCTION.md, "FAFI")', stub, "x.md") == []
    assert len(stale_numbers('27.2 ± 1.7 (REPRODUCTION.md, "FAFI")', stub, "x.md")) == 1


def test_a_citation_of_a_missing_section_is_named() -> None:
    doc = 'FAFI scores 64.2 (REPRODUCTION.md, "FAFI, Table 9").\n'
    problems = stale_numbers(doc, REPRODUCTION_STUB, "x.md")
    assert any("no section" in p for p in problems)


def test_a_table_introduced_by_a_citing_paragraph_is_checked_against_it() -> None:
    doc = 'From REPRODUCTION.md, "FAFI":\n\n| fusion | accuracy |\n|---|---:|\n| median | 64.3 |\n'
    problems = stale_numbers(doc, REPRODUCTION_STUB, "x.md")
    assert len(problems) == 1 and "64.3" in problems[0]


def test_a_paragraph_without_a_citation_is_not_checked() -> None:
    assert stale_numbers("FAFI scores 12.3 here.\n", REPRODUCTION_STUB, "x.md") == []
