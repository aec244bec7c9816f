"""The documented outputs' per-number tolerances, derived from their measured
spreads (issue 55, "a tolerance per number, from that number's own measured
spread").

``reproduction/kernel_spread_docs.json`` holds, for every marked block of
README.md and docs/ (``"FILE: COMMAND"``), its documented rows, every row's
decimals at each kernel path and machine measured (``values``, keyed
``"FINGERPRINT level"``: ``benchmarks/kernel_spread.py docs`` adds them), and
each decimal's spread over seeds (``seed_spread``, max − min, with its
``seed_source``). The rule, for one decimal with documented value d:

- m = the largest |v − d| over every path and machine measured, except
  the paths only a manual MKL pin reaches (``PINS_ONLY``: MKL's AVX2 branch,
  which MKL ignores off Intel, ``AVX2,STRICT``, and AUTO under portable's
  other pins: ``OSFL_CPU_KERNELS=portable`` before issue 55); those stay in
  the file, recorded, and are not counted;
- m = 0: the number moved nowhere and is checked exactly everywhere (its
  row is left out of the marker, or its place is ``±0``);
- 2m > s (s: its spread over seeds): no band can hold every measured path
  without being wider than the seeds' spread, so the check cannot tell the
  machine from a regression there: ``any`` (checked exactly on the exact
  machines, only its words, integers and sizes elsewhere);
- otherwise ±min(k·m, s/2), with k = ``K`` (1.5: headroom for a machine
  that moves the number a half more than any measured).

``python benchmarks/doc_tolerances.py`` prints each block's marker text
(``| elsewhere ...``) and REPRODUCTION.md's table (``--write`` puts the
marker texts into the docs);
``tests/docs/test_doc_tolerances.py`` holds the markers to this rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPREADS = ROOT / "reproduction" / "kernel_spread_docs.json"
#: How much wider than the largest measured move a band is (module docstring).
K = Decimal("1.5")
#: Levels no machine takes on its own and no osfl option sets any more: a
#: manual ``MKL_CBWR`` pin under portable's other pins (recorded, not counted).
PINS_ONLY = ("portable-avx2", "portable-avx2-strict", "portable-auto")


def counted(path: str) -> bool:
    """Whether a ``"MACHINE level"`` key counts for the tolerances."""
    return path.split(" ", 1)[-1] not in PINS_ONLY


def _text(t: Decimal | None) -> str:
    return "any" if t is None else f"±{t.normalize():f}"


def largest_move(documented: str, measured: list[str]) -> Decimal:
    """m: the largest distance of a measured value from the documented one."""
    return max((abs(Decimal(v) - Decimal(documented)) for v in measured), default=Decimal(0))


def tolerance(documented: str, measured: list[str], seed_spread: str) -> Decimal | None:
    """One decimal's tolerance by the rule (module docstring); ``None``: any."""
    m, s = largest_move(documented, measured), Decimal(seed_spread)
    if m == 0:
        return Decimal(0)
    if 2 * m > s:
        return None
    return min(K * m, s / 2)


def row_tolerances(block: dict, row: str) -> list[Decimal | None]:
    """Each decimal of a documented row: its tolerance."""
    documented = block["documented"][row]
    paths = [v[row] for k, v in block["values"].items() if row in v and counted(k)]
    seeds = block.get("seed_spread", {}).get(row)
    out = []
    for j, d in enumerate(documented):
        measured = [p[j] for p in paths if j < len(p)]
        if largest_move(d, measured) and seeds is None:
            raise SystemExit(f"{row!r} moved but has no seed_spread")
        out.append(tolerance(d, measured, seeds[j] if seeds else "0"))
    return out


def elsewhere(block: dict) -> str:
    """The marker's ``elsewhere`` text for a block: the rows that moved, with
    one tolerance where all of a row's are equal; ``exact`` where none moved."""
    parts = []
    for row in block["documented"]:
        tols = row_tolerances(block, row)
        if all(t == 0 for t in tols):
            continue
        same = all(t == tols[0] for t in tols)
        parts.append(f"{row} " + (_text(tols[0]) if same else "/".join(map(_text, tols))))
    return ", ".join(parts) or "exact"


def table(doc: dict) -> str:
    """Markdown: per moved decimal, its documented value, the measured range,
    the largest move (m), the seeds' spread (s) and the tolerance."""
    lines = [
        "| block: row | documented | measured (min – max) | m | seeds' spread s | tolerance |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, block in doc["blocks"].items():
        short = block.get("title", name)
        for row, documented in block["documented"].items():
            tols = row_tolerances(block, row)
            for j, (d, t) in enumerate(zip(documented, tols, strict=True)):
                measured = [
                    v[row][j] for k, v in block["values"].items() if row in v and counted(k)
                ]
                m = largest_move(d, measured)
                if not m:
                    continue
                lo, hi = min(measured, key=Decimal), max(measured, key=Decimal)
                s = block["seed_spread"][row][j]
                part = f" ({'mean' if j == 0 else 'std'})" if len(documented) == 2 else ""
                lines.append(
                    f"| {short}: {row}{part} | {d} | {lo} – {hi} | {m} | {s} | {_text(t)} |"
                )
    return "\n".join(lines)


def write_markers(doc: dict) -> None:
    """Rewrite each block's marker line with its derived ``elsewhere`` (the
    marker's command and ``recorded on`` part are kept)."""
    for name, block in doc["blocks"].items():
        file, command = name.split(": ", 1)
        path = ROOT / file
        lines = path.read_text().splitlines()
        head = f"<!-- doccheck: {command}"
        (i,) = [i for i, line in enumerate(lines) if line.startswith(head + " ")]
        kept = lines[i].split(" | elsewhere ", 1)[0].removesuffix(" -->")
        lines[i] = f"{kept} | elsewhere {elsewhere(block)} -->"
        path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=str(SPREADS), help="the measured spreads")
    p.add_argument("--write", action="store_true", help="rewrite the markers in the docs")
    args = p.parse_args(argv)
    doc = json.loads(Path(args.json).read_text())
    for name, block in doc["blocks"].items():
        print(f"{name}\n  | elsewhere {elsewhere(block)}")
    print(table(doc))
    if args.write:
        write_markers(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
