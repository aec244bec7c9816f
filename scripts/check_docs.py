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
found exactly (a number that no longer re-runs there is a failure). On any
other machine the check is the block's stated tolerance (``| elsewhere ±T``):
every line must keep its shape, integers and sizes (``482.5 KiB``) must be
equal, and each decimal number (an accuracy, a mean ± std) may move by at
most T; every number that moved is printed. The tolerances are the measured
spread of those numbers over the kernel paths one machine reaches
(REPRODUCTION.md, "How to read the numbers").

    python scripts/check_docs.py                 # check every marked block
    python scripts/check_docs.py --update        # run them and rewrite the blocks
    python scripts/check_docs.py README.md -k sweep     # one file, blocks whose command has "sweep"

A ``-k`` that matches no block's command exits 2 (a mistyped keyword must
not pass as "nothing differs").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(
    r"^<!-- doccheck: (?P<cmd>.*?)(?: => (?P<file>\S+))?(?: \| (?P<info>.*?))?"
    r"(?: \| elsewhere ±(?P<tol>[0-9.]+))? -->$"
)
FINGERPRINT = re.compile(r"fingerprint ([0-9a-f]{12})\b")
#: other fingerprints on which the block was re-run and found exact
EXACT_ALSO = re.compile(r"exact also on ((?:[0-9a-f]{12})(?:, [0-9a-f]{12})*)")
FENCE = re.compile(r"^```")


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
    tolerance: float | None = None  # how far a decimal may move on another machine


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
        tol = float(m["tol"]) if m["tol"] else None
        out.append(Block(path, i, start, end, m["cmd"], m["file"], m["info"], code, tol))
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
#: within the tolerance on another machine, every other must stay equal.
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_UNIT = re.compile(r"\s*(?:[KMGT]i?B|B|bytes)\b")


def _shape(line: str) -> tuple[str, list[tuple[str, bool]]]:
    """The line with its numbers replaced by ``#``, and each number with
    whether it may move (a decimal that is not a size)."""
    numbers = [
        (m[0], "." in m[0] and not _UNIT.match(line, m.end())) for m in _NUMBER.finditer(line)
    ]
    return _NUMBER.sub("#", line), numbers


def _compare_within(documented: str, fresh: str, tol: float) -> list[str] | None:
    """The moves of ``fresh`` against ``documented`` if it is the same line
    up to decimals that moved by at most ``tol`` (``None``: another line). A
    masked ``~`` cell of a fresh table row matches any documented cell."""
    a, b = _cells(documented), _cells(fresh)
    if a is not None and b is not None and len(a) == len(b):
        pairs = [(x, y) for x, y in zip(a, b, strict=True) if y.strip() != "~"]
    else:
        pairs = [(documented, fresh)]
    moves = []
    for x, y in pairs:
        (shape_x, nums_x), (shape_y, nums_y) = _shape(x), _shape(y)
        if shape_x != shape_y:
            return None
        for (u, free), (v, _) in zip(nums_x, nums_y, strict=True):
            if u == v:
                continue
            if not free or abs(float(u) - float(v)) > tol:
                return None
            moves.append(f"{u} -> {v}")
    return moves


def differences_within(documented: str, fresh: str, tol: float) -> tuple[list[str], list[str]]:
    """(documented lines not found in order within ``tol``, the numbers that
    moved): the check on a machine whose fingerprint is not the recorded one."""
    want, have = mask(documented), mask(fresh)
    i, missing, moved = 0, [], []
    for line in want:
        if not line:
            continue
        for k in range(i, len(have)):
            moves = _compare_within(line, have[k], tol)
            if moves is not None:
                moved += [
                    f"{line[:40]}...: {m}" if len(line) > 40 else f"{line}: {m}" for m in moves
                ]
                i = k + 1
                break
        else:
            missing.append(line)
    return missing, moved


def largest_move(moved: list[str]) -> float:
    """The largest absolute move in :func:`differences_within`'s list."""
    sizes = [
        abs(float(b) - float(a)) for a, b in (m.rsplit(": ", 1)[1].split(" -> ") for m in moved)
    ]
    return max(sizes, default=0.0)


def update(block: Block, fresh: str) -> None:
    lines = block.path.read_text().splitlines()
    marker = f"<!-- doccheck: {block.command}"
    marker += f" => {block.file}" if block.file else ""
    marker += f" | recorded on {machine()}"
    marker += f" | elsewhere ±{block.tolerance:g} -->" if block.tolerance is not None else " -->"
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
    tol = tolerance if tolerance is not None else block.tolerance
    print(f"  {block.info or 'recorded on an unnamed machine'}; this is {here}")
    if tol is None:
        print("  DIFFERS: another machine, and the marker states no tolerance (| elsewhere ±T)")
        return False
    missing, moved = differences_within(documented, fresh, tol)
    _report(f"numbers that moved (each within ±{tol:g}; largest {largest_move(moved):g}):", moved)
    _report("warnings the docs do not show (another machine: reported, not failed):",
            unexpected_warnings(documented, fresh))  # fmt: skip
    if missing:
        _report(f"DIFFERS; documented lines not in the fresh output within ±{tol:g}:", missing)
        return False
    print(f"  ok within ±{tol:g} (another machine)")
    return True


if __name__ == "__main__":
    sys.exit(main())
