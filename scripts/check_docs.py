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
run must not start warning unnoticed). Accuracies on CPU
depend on the kernel path torch dispatches to
(``torch.backends.cpu.get_cpu_capability()``); ``--update`` records it next to
the marker, and a check on another kernel path says so instead of calling
a mismatch a bug.

    python scripts/check_docs.py                 # check every marked block
    python scripts/check_docs.py --update        # run them and rewrite the blocks
    python scripts/check_docs.py README.md -k default   # one file, blocks whose command has "default"
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
MARKER = re.compile(r"^<!-- doccheck: (?P<cmd>.*?)(?: => (?P<file>\S+))?(?: \| (?P<info>.*?))? -->$")
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


def machine() -> str:
    import torch

    return f"torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}"


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
        out.append(Block(path, i, start, end, m["cmd"], m["file"], m["info"], code))
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


_WALL = re.compile(r"\(\d+(?:\.\d+)? s\)")
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
        line = _RUN_DIR.sub("run directory: ~", _WALL.sub("(~ s)", line)).rstrip()
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


def update(block: Block, fresh: str) -> None:
    lines = block.path.read_text().splitlines()
    marker = f"<!-- doccheck: {block.command}"
    marker += f" => {block.file}" if block.file else ""
    marker += f" | recorded on {machine()} -->"
    lines[block.marker_line] = marker
    lines[block.start : block.end] = fresh.rstrip("\n").splitlines()
    block.path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="Markdown files (default: README.md, docs/**/*.md)")
    p.add_argument("-k", dest="keyword", help="only blocks whose command contains this")
    p.add_argument("--update", action="store_true", help="rewrite the blocks with fresh output")
    args = p.parse_args(argv)
    # relative paths are the caller's (python scripts/check_docs.py README.md from the root)
    files = [Path(f).resolve() for f in args.files] or [
        ROOT / "README.md",
        *sorted(ROOT.glob("docs/**/*.md")),
    ]
    here, failures = machine(), 0
    for path in files:
        # blocks of one file from the last to the first: an update keeps earlier line numbers
        for block in reversed(blocks(path)):
            if args.keyword and args.keyword not in block.command:
                continue
            where = f"{path.relative_to(ROOT)}:{block.marker_line + 1}"
            print(f"{where}: {block.command}", flush=True)
            fresh = run(block)
            if args.update:
                update(block, fresh)
                print("  updated")
                continue
            documented = "\n".join(path.read_text().splitlines()[block.start : block.end])
            missing = missing_lines(documented, fresh)
            extra = unexpected_warnings(documented, fresh)
            if not missing and not extra:
                print("  ok")
                continue
            recorded = (block.info or "").removeprefix("recorded on ")
            if recorded and recorded != here:
                print(f"  differs, but the docs were recorded on {recorded} and this is {here}")
                continue
            failures += 1
            if missing:
                print("  DIFFERS; documented lines not in the fresh output:")
                for line in missing:
                    print(f"    {line}")
            if extra:
                print("  DIFFERS; warnings the docs do not show:")
                for line in extra:
                    print(f"    {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
