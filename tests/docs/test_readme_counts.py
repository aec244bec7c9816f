"""The README's size and time of the fast suite are TESTING.md's last measured
run, rounded as a reader rounds them: the count of passed tests to the
nearest 50 ("about 2,250 tests" for 2,248 passed) and the wall time to the
nearest minute ("about 9 minutes" for 517.0 s). When a new CI run is recorded
in TESTING.md, a README that still quotes the old one fails here."""

from __future__ import annotations

import re

from support.paths import ROOT

#: TESTING.md's record of a CI run: "**2,248 passed, 6 skipped, 83 deselected in 517.0 s**"
RECORD = re.compile(r"\*\*([\d,]+) passed, [\d,]+ skipped, [\d,]+ deselected in ([\d.]+) s\*\*")
#: The README's two statements: prose ("about 2,250 tests: about 9 minutes")
#: and the Development block ("~2,250 tests, ~9 min")
QUOTES = (
    re.compile(r"about ([\d,]+) tests: about (\d+) minutes"),
    re.compile(r"~([\d,]+) tests, ~(\d+) min\b"),
)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def readme_problems(readme: str, testing: str) -> list[str]:
    """What the README says of the fast suite that TESTING.md's first (latest)
    run in "The fast suite", rounded, does not say."""
    section = testing.split("## The fast suite", 1)[-1].split("\n## ", 1)[0]
    found = RECORD.search(re.sub(r"\s+", " ", section))  # the record may wrap
    if found is None:
        return ['TESTING.md\'s "The fast suite" records no "**N passed, ... in S s**" run']
    passed, seconds = _int(found.group(1)), float(found.group(2))
    count, minutes = round(passed / 50) * 50, round(seconds / 60)
    text = re.sub(r"\s+", " ", readme)
    quotes = [m for pattern in QUOTES for m in pattern.finditer(text)]
    if len(quotes) < len(QUOTES):
        return ["the README no longer states the fast suite's size and time twice"]
    return [
        f"README says {m.group(0)!r}, but TESTING.md's last run is {passed:,} passed in "
        f"{seconds:.1f} s: about {count:,} tests, about {minutes} minutes"
        for m in quotes
        if (_int(m.group(1)), int(m.group(2))) != (count, minutes)
    ]


def test_the_readme_quotes_the_last_measured_run_rounded() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    testing = (ROOT / "TESTING.md").read_text(encoding="utf-8")
    assert readme_problems(readme, testing) == []


def test_a_readme_quoting_an_older_run_is_named() -> None:
    testing = "## The fast suite\n\nran **2,393 passed, 8 skipped, 83 deselected in 1920.4 s**\n"
    readme = "runs the fast suite, about 2,250 tests: about 9 minutes on\n`~2,250 tests, ~9 min`"
    problems = readme_problems(readme, testing)
    assert len(problems) == 2
    assert problems[0] == (
        "README says 'about 2,250 tests: about 9 minutes', but TESTING.md's last run is "
        "2,393 passed in 1920.4 s: about 2,400 tests, about 32 minutes"
    )
    fixed = readme.replace("2,250", "2,400").replace("9 min", "32 min")
    assert readme_problems(fixed, testing) == []
    assert readme_problems("nothing", testing) == [
        "the README no longer states the fast suite's size and time twice"
    ]
