"""Size and complexity held by a measure that counts what matters.

- No function in ``src/osfl`` is over :data:`MAX_COMPLEXITY` by radon's
  cyclomatic complexity, which counts each boolean operator (``a and b or c``
  is two decisions) where ruff's mccabe check (``max-complexity`` in
  pyproject.toml, kept too) does not. A function over it is split into named
  steps, never given an exception here.
- No source file is over :data:`MAX_LINES` lines unless its module docstring
  says why (docs/design.md).
- ``# fmt: skip`` only where :data:`ALLOWED_FMT_SKIP` says why: a marker is
  known by its file and the stripped text of its line (not by line number),
  so a moved table keeps its reason and any other marker fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from radon.complexity import cc_visit  # the [dev] extra; CI installs it

from support.paths import ROOT

SRC = ROOT / "src" / "osfl"
MAX_COMPLEXITY = 15
MAX_LINES = 500
#: words a long file's module docstring uses to give its reason
REASON_WORDS = ("lines", "long", "one file", "kept together", "over 500")

#: (file under src/osfl, the marked line's text without its marker) -> why
ALLOWED_FMT_SKIP: dict[tuple[str, str], str] = {
    (
        "data/sources/domain_styles.py",
        "_MEDIAN9 = (",
    ): "the 19 compare-exchange pairs of Paeth's median network, ten to a line as "
    "in Graphics Gems; one pair a line would hide the network's shape",
}


def _functions(blocks: list) -> Iterator:  # radon's Function and Class blocks
    for block in blocks:
        if hasattr(block, "methods"):  # a class: its methods are listed on their own too
            continue
        yield block
        yield from _functions(block.closures)


def over_limit(text: str, limit: int = MAX_COMPLEXITY) -> list[tuple[str, int, int]]:
    """``(name, line, complexity)`` of every function (methods and nested
    functions included) of ``text`` over ``limit``."""
    blocks = cc_visit(text)
    found = {
        (f.fullname, f.lineno, f.complexity) for f in _functions(blocks) if f.complexity > limit
    }
    return sorted(found, key=lambda r: (r[1], r[0]))


def test_no_function_is_over_the_complexity_limit() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name}: {cc}"
        for path in sorted(SRC.rglob("*.py"))
        for name, line, cc in over_limit(path.read_text())
    ]
    assert not offenders, (
        f"functions over radon complexity {MAX_COMPLEXITY} (split them into named steps):\n"
        + "\n".join(offenders)
    )


def test_the_gate_counts_boolean_operators() -> None:
    """Fifteen ``if`` with two ``and`` each: mccabe counts 16, radon 46."""
    body = "".join(f"    if a and b and c{i}:\n        return {i}\n" for i in range(15))
    text = f"def f(a, b, {', '.join(f'c{i}' for i in range(15))}):\n{body}    return -1\n"
    ((name, _, cc),) = over_limit(text)
    assert (name, cc) == ("f", 46)
    assert over_limit(text, limit=46) == []
    nested = "def outer():\n    " + text.replace("\n", "\n    ")
    assert [n for n, _, _ in over_limit(nested)] == ["f"]  # a closure is measured on its own


def test_a_long_file_says_why() -> None:
    unexplained = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") <= MAX_LINES:
            continue
        doc = (ast.get_docstring(ast.parse(text)) or "").lower()
        if not any(w in doc for w in REASON_WORDS):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, (
        f"source files over {MAX_LINES} lines whose docstring gives no reason: {unexplained}"
    )


def fmt_skip_markers() -> list[tuple[str, str]]:
    """``(file, first line of the marked statement)`` of every marker: the
    statement ends on the marked line (``)  # fmt: skip`` closes a table)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        marked = [i + 1 for i, line in enumerate(lines) if "# fmt: skip" in line]
        if not marked:
            continue
        statements = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt)]
        for line in marked:
            # the innermost statement that ends there (a comment line: itself)
            start = max((n.lineno for n in statements if n.end_lineno == line), default=line)
            found.append((path.relative_to(SRC).as_posix(), lines[start - 1].strip()))
    return found


def test_fmt_skip_only_where_a_reason_is_given() -> None:
    markers = fmt_skip_markers()
    unexplained = [m for m in markers if m not in ALLOWED_FMT_SKIP]
    assert not unexplained, (
        "`# fmt: skip` without a reason in ALLOWED_FMT_SKIP (remove it and run ruff format, "
        f"or say why): {unexplained}"
    )
    stale = [k for k in ALLOWED_FMT_SKIP if k not in markers]
    assert not stale, f"reasons for markers that are gone: {stale}"
