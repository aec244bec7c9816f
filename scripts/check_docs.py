"""Check (or regenerate) the outputs printed in README.md and docs/**/*.md.

A documented output is a fenced block preceded by a marker::

    <!-- doccheck: osfl run --no-progress --out {tmp}/run cache_dir={tmp}/cache -->
    ```
    ...what that command printed...
    ```

The command runs in a shell from the repository root (``{tmp}`` is a fresh
temporary directory); ``=> FILE`` after it compares the block with
``{tmp}/FILE`` instead of the command's stdout. ``<!-- doccheck: python -->``
before a ```` ```python ```` block runs that block and compares the fenced
block after it with what it prints.

Numbers that depend on the machine's load, not on the code, are masked before
comparing: wall times, the ``time (s)`` column of tables, run-directory
paths. Every line of the documented block must appear (in order) in the fresh
output, so a doc may show an excerpt of a longer table; a warning line in the
fresh output that the block does not show is a difference too (a documented
run must not start warning unnoticed).

Accuracies on a CPU depend on the kernel paths torch dispatches to (ATen's
capability, oneDNN's ISA, MKL's branch, the CPU's flags and caches: the CPU
fingerprint of ``osfl.fl.fingerprint``); ``--update`` records the machine's
fingerprint in the marker (``| recorded on ..., fingerprint ID``; ``; exact
also on ID, ...`` adds machines where a re-run found every line exact). Where
this machine's fingerprint is one of those, every documented line must be
found exactly (a number that no longer re-runs there is a failure).

On any other machine the check is the marker's per-number tolerances
(``| elsewhere ROW ±T, ROW ±T/±T, ROW any`` or ``| elsewhere exact``; issue
55): every line must keep its shape, integers and sizes (``482.5 KiB``) must
be equal, and each decimal of a documented line may move by at most its
row's tolerance. A ROW is words that the line's label (its text before its
first decimal, table rules as spaces) holds: ``fedavg`` is the table row
``│ fedavg │ 1 │ 51.44 │``, ``partition.alpha=0.1 fedavg`` the sweep's row;
``±T`` applies to every decimal of the row, ``±T1/±T2`` to its first and
second (a mean and its std); ``any`` checks the row's words, integers and
sizes but not its decimals (a number whose move across machines exceeds its
spread over seeds, so no band could tell a regression from the machine). A
decimal in a row the marker does not name moved on no machine measured and
is checked exactly everywhere. Each tolerance is k times the largest move of
that number from its documented value over every kernel path and machine
measured, capped by its spread over seeds (REPRODUCTION.md, "How much the
machine moves a number"; ``reproduction/kernel_spread_docs.json``); every
number that moved is printed with its tolerance.

    python scripts/check_docs.py                 # check every marked block
    python scripts/check_docs.py --update        # run them and rewrite the blocks
    python scripts/check_docs.py README.md -k sweep     # one file, blocks whose command has "sweep"

A block re-recorded with ``--update`` needs its spreads measured again
(``python benchmarks/kernel_spread.py docs --json reproduction/kernel_spread_docs.json
FILE``, on each machine at hand) and its tolerances derived again
(``python benchmarks/doc_tolerances.py --write``);
``tests/docs/test_doc_tolerances.py`` fails until both are done.

A ``-k`` that matches no block's command exits 2 (a mistyped keyword must
not pass as "nothing differs").

One file of over 500 lines: the marker's grammar, the masking and both
checks read lines through the same few functions (``mask``, ``_cells``,
``_shape``), and a script outside the package has no sibling to import
them from without changing ``sys.path``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(
    r"^<!-- doccheck: (?P<cmd>.*?)(?: => (?P<file>\S+))?(?: \| (?P<info>.*?))?"
    r"(?: \| elsewhere (?P<elsewhere>.+?))? -->$"
)
FINGERPRINT = re.compile(r"fingerprint ([0-9a-f]{12})\b")
#: other fingerprints on which the block was re-run and found exact
EXACT_ALSO = re.compile(r"exact also on ((?:[0-9a-f]{12})(?:, [0-9a-f]{12})*)")
FENCE = re.compile(r"^```")


class MarkerError(ValueError):
    """A marker whose ``elsewhere`` part cannot be read or does not fit its block."""


#: A decimal's tolerance: how far it may move (``None``: any value, ``any``).
Tolerance = Decimal | None


@dataclass(frozen=True)
class Band:
    """One row of a marker's ``elsewhere``: the words its documented line's
    label holds, and the tolerance of each of its decimals (one for all, or
    one per decimal in order)."""

    words: tuple[str, ...]
    tolerances: tuple[Tolerance, ...]

    def text(self) -> str:
        tols = "/".join("any" if t is None else f"±{t}" for t in self.tolerances)
        return f"{' '.join(self.words)} {tols}"


def _tolerance(text: str) -> Tolerance:
    if text == "any":
        return None
    try:
        value = Decimal(text.removeprefix("±")) if text.startswith("±") else None
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite() or value < 0:
        raise MarkerError(f"{text!r} is not a tolerance (±T, with T >= 0, or any)")
    return value


@dataclass(frozen=True)
class Elsewhere:
    """How far each documented decimal may move off the exact machines: per
    row (``bands``), or one tolerance for every decimal (``everything``: the
    ``--tolerance`` of a measurement, e.g. 1000 to print every move)."""

    bands: tuple[Band, ...] = ()
    everything: Tolerance = None

    @classmethod
    def parse(cls, text: str) -> Elsewhere:
        """``exact``, or ``ROW ±T, ROW ±T/±T, ROW any`` (module docstring)."""
        if text.strip() == "exact":
            return cls()
        bands = []
        for part in text.split(","):
            *words, spec = part.split() or ["?"]
            if not words:
                raise MarkerError(f"elsewhere {text!r}: {part.strip()!r} names no row")
            bands.append(Band(tuple(words), tuple(_tolerance(t) for t in spec.split("/"))))
        return cls(tuple(bands))

    @classmethod
    def uniform(cls, tolerance: float) -> Elsewhere:
        return cls(everything=Decimal(str(tolerance)))

    def text(self) -> str:
        return ", ".join(b.text() for b in self.bands) or "exact"

    def for_line(self, line: str) -> list[Tolerance]:
        """The tolerance of each decimal of a (masked) documented line: its
        row's, or exact (``0``) where no row names the line."""
        count = sum(free for _, free in _shape(line)[1])
        if self.everything is not None:
            return [self.everything] * count
        label = row_label(line)
        rows = [b for b in self.bands if set(b.words) <= label]
        if not count or not rows:
            return [Decimal(0)] * count
        if len(rows) > 1:
            names = " and ".join(repr(" ".join(b.words)) for b in rows)
            raise MarkerError(f"rows {names} both name the line {line!r}")
        tols = rows[0].tolerances
        if len(tols) == 1:
            return list(tols) * count
        if len(tols) != count:
            raise MarkerError(f"row {' '.join(rows[0].words)!r} gives {len(tols)} tolerances "
                              f"to a line with {count} decimals: {line!r}")  # fmt: skip
        return list(tols)

    def unused(self, documented: str) -> list[str]:
        """Rows that name no documented line with a decimal (a mistyped row
        must not pass as checked)."""
        labels = [row_label(line) for line in mask(documented) if self.for_line(line)]
        return [b.text() for b in self.bands if not any(set(b.words) <= lb for lb in labels)]


@dataclass
class Block:
    path: Path
    marker_line: int  # index of the marker line
    start: int  # index of the first content line of the output block
    end: int  # index of its closing fence
    command: str
    file: str | None
    info: str | None
    code: str | None = None  # the python block a "python" marker runs
    elsewhere: Elsewhere | None = None  # how far each decimal may move on another machine


def machine() -> str:
    """This machine's CPU fingerprint as the marker records it (the kernel
    variables in this process's environment are the commands' too)."""
    from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_text

    return fingerprint_text(cpu_fingerprint())


def recorded_fingerprint(info: str | None) -> str | None:
    """The fingerprint id a marker's ``recorded on`` names (``None``: an old
    marker that recorded only torch and its capability)."""
    m = FINGERPRINT.search(info or "")
    return m[1] if m else None


def exact_fingerprints(info: str | None) -> set[str]:
    """Every fingerprint on which the block is checked exactly: the recorded
    one and those a re-run there found exact (``; exact also on ID, ID``), so
    the check stays strict on each machine known to give the documented
    numbers (two fingerprints may differ in a field that did not move them)."""
    recorded = recorded_fingerprint(info)
    also = EXACT_ALSO.search(info or "")
    return ({recorded} if recorded else set()) | (set(also[1].split(", ")) if also else set())


def _fence_after(lines: list[str], i: int) -> tuple[int, int]:
    """(first content line, closing fence) of the fenced block starting at or after ``i``."""
    while i < len(lines) and not FENCE.match(lines[i]):
        i += 1
    j = i + 1
    while j < len(lines) and not FENCE.match(lines[j]):
        j += 1
    if j >= len(lines):
        raise SystemExit(f"unclosed fenced block after line {i + 1}")
    return i + 1, j


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        code = None
        start, end = _fence_after(lines, i + 1)
        if m["cmd"] == "python":
            code = "\n".join(lines[start:end])
            start, end = _fence_after(lines, end + 1)
        try:
            elsewhere = Elsewhere.parse(m["elsewhere"]) if m["elsewhere"] else None
        except MarkerError as err:
            raise SystemExit(f"{path.name}:{i + 1}: {err}") from None
        out.append(Block(path, i, start, end, m["cmd"], m["file"], m["info"], code, elsewhere))
    return out


def run(block: Block) -> str:
    with tempfile.TemporaryDirectory(prefix="doccheck-") as tmp:
        env = {**os.environ, "COLUMNS": "160"}
        if block.code is not None:
            proc = subprocess.run(
                [sys.executable, "-"], input=block.code, text=True, capture_output=True,
                cwd=tmp, env=env, timeout=3600,
            )  # fmt: skip
        else:
            cmd = block.command.replace("{tmp}", tmp)
            proc = subprocess.run(
                cmd, shell=True, text=True, capture_output=True, cwd=ROOT, env=env, timeout=3600
            )
        if proc.returncode != 0:
            raise RuntimeError(f"`{block.command}` failed:\n{proc.stdout}\n{proc.stderr}")
        text = proc.stdout
        if block.file:
            text = (Path(tmp) / block.file).read_text()
        return text.replace(tmp, "{tmp}")


_WALL = re.compile(r"\(\d+(?:\.\d+)? s\)|(?<=wall time )\d+(?:\.\d+)? s")
_RUN_DIR = re.compile(r"run directory: \S+")
_RULE = re.compile(r"[━─┡┩╇└┘┴┌┐┬├┤┼]")


def _cells(line: str) -> list[str] | None:
    for sep in ("│", "┃", "|"):
        if line.count(sep) >= 2:
            return line.split(sep)
    return None


def mask(text: str) -> list[str]:
    """Lines with the machine-dependent parts replaced by ``~``."""
    out, time_col = [], None
    for line in text.splitlines():
        line = _WALL.sub(lambda m: "(~ s)" if m[0].startswith("(") else "~ s", line)
        line = _RUN_DIR.sub("run directory: ~", line).rstrip()
        cells = _cells(line)
        if cells is not None:
            names = [c.strip() for c in cells]
            if "time (s)" in names:
                time_col = names.index("time (s)")
            elif time_col is not None and len(cells) > time_col and cells[time_col].strip():
                cells[time_col] = " ~ "
                line = "".join(c + ("│" if "│" in line else "|") for c in cells[:-1]) + cells[-1]
        elif not _RULE.search(line):  # a rule (┡━━╇━┩, └──┴─┘) keeps the table's columns
            time_col = None
        out.append(re.sub(r"\s+", " ", line).strip())
    return out


def _same(documented: str, fresh: str) -> bool:
    """Equal lines, where a masked (``~``) cell of the fresh line matches any
    cell (a documented excerpt may lack the header that names the column)."""
    if documented == fresh:
        return True
    a, b = _cells(documented), _cells(fresh)
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x.strip() == y.strip() or y.strip() == "~" for x, y in zip(a, b, strict=True))


def missing_lines(documented: str, fresh: str) -> list[str]:
    """Documented lines (masked) not found in order in the fresh output."""
    want, have = mask(documented), mask(fresh)
    i, missing = 0, []
    for line in want:
        if not line:
            continue
        j = next((k for k in range(i, len(have)) if _same(line, have[k])), None)
        if j is None:
            missing.append(line)
        else:
            i = j + 1
    return missing


_WARNING = re.compile(r"^(warning|WARNING)\b")


def unexpected_warnings(documented: str, fresh: str) -> list[str]:
    """Warning lines of the fresh output (``warning ...``, ``WARNING ...``) that
    the documented block does not show."""
    shown = set(mask(documented))
    return [line for line in mask(fresh) if _WARNING.match(line) and line not in shown]


#: A number in a line; a decimal one not followed by a size unit may move
#: within its tolerance on another machine, every other must stay equal. A
#: setting's value (``partition.alpha=0.1``) is part of the row's words.
_NUMBER = re.compile(r"(?<![\w.=])\d+(?:\.\d+)?(?![\w.])")
_UNIT = re.compile(r"\s*(?:[KMGT]i?B|B|bytes)\b")
_SEPARATORS = re.compile(r"[│┃|]")


def _shape(line: str) -> tuple[str, list[tuple[str, bool]]]:
    """The line with its numbers replaced by ``#``, and each number with
    whether it may move (a decimal that is not a size)."""
    numbers = [
        (m[0], "." in m[0] and not _UNIT.match(line, m.end())) for m in _NUMBER.finditer(line)
    ]
    return _NUMBER.sub("#", line), numbers


def label_words(line: str) -> list[str]:
    """The words of a line before its first decimal that may move, in order
    (table rules as spaces, a trailing ``:`` or ``,`` dropped)."""
    first = next(
        (m for m in _NUMBER.finditer(line) if "." in m[0] and not _UNIT.match(line, m.end())),
        None,
    )
    head = _SEPARATORS.sub(" ", line[: first.start()] if first else line)
    return [w for w in (w.rstrip(":,;") for w in head.split()) if w]


def row_label(line: str) -> set[str]:
    """What a marker's row must name of a line (``fedavg``,
    ``partition.alpha=0.1 fedavg``): a subset of these words."""
    return set(label_words(line))


@dataclass(frozen=True)
class Move:
    """A decimal of a documented line, its value in the fresh output and its tolerance."""

    documented: str
    fresh: str
    tolerance: Tolerance

    @property
    def size(self) -> Decimal:
        return abs(Decimal(self.fresh) - Decimal(self.documented))

    @property
    def allowed(self) -> bool:
        return self.tolerance is None or self.size <= self.tolerance

    def text(self) -> str:
        band = "any" if self.tolerance is None else f"±{self.tolerance}"
        return f"{self.documented} -> {self.fresh} ({band})"


def _decimal_pairs(documented: str, fresh: str) -> list[tuple[str, str | None]] | None:
    """Each decimal of ``documented`` with its value in ``fresh`` (``None``
    in a masked ``~`` cell of a fresh table row, which matches any documented
    cell), if ``fresh`` is the same line up to decimals (``None``: another
    line: another shape, integer or size)."""
    a, b = _cells(documented), _cells(fresh)
    cells = list(zip(a, b, strict=True)) if a and b and len(a) == len(b) else [(documented, fresh)]
    pairs: list[tuple[str, str | None]] = []
    for x, y in cells:
        (shape_x, nums_x), (shape_y, nums_y) = _shape(x), _shape(y)
        if y.strip() == "~":
            pairs += [(u, None) for u, free in nums_x if free]
            continue
        if shape_x != shape_y:
            return None
        for (u, free), (v, _) in zip(nums_x, nums_y, strict=True):
            if not free and u != v:
                return None
            pairs += [(u, v)] if free else []
    return pairs


def _moves(documented: str, fresh: str, tols: list[Tolerance]) -> list[Move] | None:
    """The decimals of ``fresh`` that differ from ``documented`` (``None``:
    another line); ``tols`` holds one tolerance per decimal of ``documented``."""
    pairs = _decimal_pairs(documented, fresh)
    if pairs is None:
        return None
    return [
        Move(u, v, t) for (u, v), t in zip(pairs, tols, strict=True) if v is not None and u != v
    ]


def row_values(documented: str, fresh: str) -> dict[str, list[str]]:
    """Every documented row's decimals as ``fresh`` prints them (lines matched
    in order as the check matches them, any move allowed; a row ``fresh``
    lacks is left out), keyed by the row's words: its label without integers
    and without the words every row shares (``fedavg``, ``partition.alpha=0.1
    fedavg``). What ``benchmarks/kernel_spread.py docs`` keeps per kernel path."""
    rows = [line for line in mask(documented) if _decimal_pairs(line, line)]
    words = [[w for w in label_words(line) if not w.isdigit()] for line in rows]
    shared = set.intersection(*map(set, words)) if len(words) > 1 else set()
    if any(set(row) <= shared for row in words):
        shared = set()  # a row would be left with no word
    have, i, out = mask(fresh), 0, {}
    for line, row in zip(rows, words, strict=True):
        key = " ".join(w for w in row if w not in shared)
        key += f" #{sum(k.split(' #')[0] == key for k in out) + 1}" if key in out else ""
        for k in range(i, len(have)):
            pairs = _decimal_pairs(line, have[k])
            if pairs is not None:
                out[key] = [v or u for u, v in pairs]
                i = k + 1
                break
    return out


def _label(line: str, move: Move) -> str:
    return f"{line[:40]}...: {move.text()}" if len(line) > 40 else f"{line}: {move.text()}"


def differences_within(
    documented: str, fresh: str, elsewhere: Elsewhere
) -> tuple[list[str], list[str]]:
    """(documented lines not found in order within their tolerances, the
    numbers that moved): the check on a machine whose fingerprint is not an
    exact one. A missing line whose counterpart moved too far names the
    numbers beyond their tolerance."""
    want, have = mask(documented), mask(fresh)
    i, missing, moved = 0, [], []
    for line in want:
        if not line:
            continue
        tols = elsewhere.for_line(line)
        for k in range(i, len(have)):
            moves = _moves(line, have[k], tols)
            if moves is not None and all(m.allowed for m in moves):
                moved += [_label(line, m) for m in moves]
                i = k + 1
                break
        else:
            near = (_moves(line, h, tols) for h in have[i:])
            beyond = next((m for m in near if m is not None), [])
            too_far = [m.text() for m in beyond if not m.allowed]
            missing.append(line + (f"  [beyond: {', '.join(too_far)}]" if too_far else ""))
    return missing, moved


_MOVE = re.compile(r": (\S+) -> (\S+) \((?:±\S+|any)\)$")


def largest_move(moved: list[str]) -> float:
    """The largest absolute move in :func:`differences_within`'s list."""
    sizes = [abs(float(m[2]) - float(m[1])) for m in map(_MOVE.search, moved) if m]
    return max(sizes, default=0.0)


def update(block: Block, fresh: str) -> None:
    lines = block.path.read_text().splitlines()
    marker = f"<!-- doccheck: {block.command}"
    marker += f" => {block.file}" if block.file else ""
    marker += f" | recorded on {machine()}"
    marker += f" | elsewhere {block.elsewhere.text()} -->" if block.elsewhere else " -->"
    lines[block.marker_line] = marker
    lines[block.start : block.end] = fresh.rstrip("\n").splitlines()
    block.path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="Markdown files (default: README.md, docs/**/*.md)")
    p.add_argument("-k", dest="keyword", help="only blocks whose command contains this")
    p.add_argument("--update", action="store_true", help="rewrite the blocks with fresh output")
    p.add_argument("--tolerance", type=float, default=None,
                   help="on another machine, this tolerance instead of each block's "
                   "(e.g. 1000 to print every number that moved)")  # fmt: skip
    args = p.parse_args(argv)
    # relative paths are the caller's (python scripts/check_docs.py README.md from the root)
    files = [Path(f).resolve() for f in args.files] or [
        ROOT / "README.md",
        *sorted(ROOT.glob("docs/**/*.md")),
    ]
    here, failures, matched = machine(), 0, 0
    for path in files:
        # blocks of one file from the last to the first: an update keeps earlier line numbers
        for block in reversed(blocks(path)):
            if args.keyword and args.keyword not in block.command:
                continue
            matched += 1
            where = f"{path.relative_to(ROOT)}:{block.marker_line + 1}"
            print(f"{where}: {block.command}", flush=True)
            fresh = run(block)
            if args.update:
                update(block, fresh)
                print("  updated")
                continue
            documented = "\n".join(path.read_text().splitlines()[block.start : block.end])
            failures += not judge(block, documented, fresh, here, args.tolerance)
    if args.keyword and not matched:
        print(
            f"check_docs: no doccheck block's command contains {args.keyword!r} "
            f"(in {len(files)} file(s)); nothing was checked",
            file=sys.stderr,
        )
        return 2
    return 1 if failures else 0


def _report(title: str, lines: list[str]) -> None:
    if lines:
        print(f"  {title}")
        for line in lines:
            print(f"    {line}")


def judge(block: Block, documented: str, fresh: str, here: str, tolerance: float | None) -> bool:
    """Whether ``fresh`` shows what the block documents: exactly on the
    machine the block was recorded on, within its tolerance elsewhere (the
    module docstring); prints the verdict and every difference."""
    if recorded_fingerprint(here) in exact_fingerprints(block.info):
        missing = missing_lines(documented, fresh)
        extra = unexpected_warnings(documented, fresh)
        if not missing and not extra:
            print("  ok (the recorded machine: exact)")
            return True
        _report("DIFFERS; documented lines not in the fresh output:", missing)
        _report("DIFFERS; warnings the docs do not show:", extra)
        return False
    elsewhere = Elsewhere.uniform(tolerance) if tolerance is not None else block.elsewhere
    print(f"  {block.info or 'recorded on an unnamed machine'}; this is {here}")
    if elsewhere is None:
        print("  DIFFERS: another machine, and the marker states no tolerance (| elsewhere ...)")
        return False
    try:
        unused = elsewhere.unused(documented)
        missing, moved = differences_within(documented, fresh, elsewhere)
    except MarkerError as err:
        print(f"  DIFFERS: the marker's elsewhere does not fit the block: {err}")
        return False
    if unused:
        print(f"  DIFFERS: the marker's rows {unused} name no documented line with a decimal")
        return False
    _report(f"numbers that moved (each within its tolerance; largest {largest_move(moved):g}):",
            moved)  # fmt: skip
    _report("warnings the docs do not show (another machine: reported, not failed):",
            unexpected_warnings(documented, fresh))  # fmt: skip
    if missing:
        _report("DIFFERS; documented lines not in the fresh output within their tolerances:",
                missing)  # fmt: skip
        return False
    print(f"  ok within the marker's tolerances (another machine: {elsewhere.text()})")
    return True


if __name__ == "__main__":
    sys.exit(main())
