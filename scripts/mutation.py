"""Mutation testing of osfl's algorithm cores with mutmut (TESTING.md).

    python scripts/mutation.py osfl.fl.aggregators            # one module
    python scripts/mutation.py osfl.privacy.label_recovery    # a package
    python scripts/mutation.py --all                          # every core module
    python scripts/mutation.py --report osfl.fl.aggregators   # the table only

Runs ``mutmut run "<module>*"`` for each module (mutmut 3 runs, for each
mutant, only the fast tests that execute the mutated function, as its first
run traces them), then prints one row per source file: mutants, killed,
survived, no tests, timeouts, the mutants judged equivalent
(``tests/mutation_equivalent/*.txt``: one mutant name and a ``#`` reason per
line, one file per group of modules) and the kill rate of the non-equivalent
ones. ``mutmut show NAME``
prints a mutant's diff; ``mutmut results`` lists the survivors.

mutmut is not a dependency of osfl: ``pip install mutmut==3.8.1``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tests" / "mutation_equivalent"
#: The algorithm cores under mutation testing (what [tool.mutmut] only_mutate covers).
CORES = (
    "osfl.methods",
    "osfl.privacy",
    "osfl.fl.aggregators",
    "osfl.fl.upload",
    "osfl.robustness",
    "osfl.scoreboard",
)
#: mutmut's exit codes by outcome (mutmut/stats.py).
KILLED, SURVIVED, NO_TESTS, TIMEOUT = {1, 3, 37}, {0}, {5, 33}, {24, -24, 36, 152, 255}


def equivalent() -> dict[str, str]:
    """Mutant name -> why it cannot change what osfl computes."""
    out: dict[str, str] = {}
    for listing in sorted(EQUIVALENT.glob("*.txt")):
        for line in listing.read_text().splitlines():
            name, _, why = line.partition("#")
            if name.strip():
                out[name.strip()] = why.strip()
    return out


def results(prefixes: list[str]) -> dict[str, Counter]:
    """Per source module: counts of each outcome of its mutants."""
    same = equivalent()
    rows: dict[str, Counter] = {}
    for meta in sorted((ROOT / "mutants" / "src").rglob("*.meta")):
        rel = meta.relative_to(ROOT / "mutants" / "src").with_suffix("").with_suffix("")
        module = ".".join(rel.parts)
        if not any(module == p or module.startswith(p + ".") for p in prefixes):
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        c: Counter = Counter()
        for name, code in codes.items():
            c["mutants"] += 1
            if name in same:
                c["equivalent"] += 1
            elif code in KILLED:
                c["killed"] += 1
            elif code in SURVIVED:
                c["survived"] += 1
            elif code in NO_TESTS:
                c["no tests"] += 1
            elif code in TIMEOUT:
                c["killed"] += 1  # a mutant that hangs the tests is caught
            else:
                c["not run"] += 1
        rows[module] = c
    return rows


def table(rows: dict[str, Counter]) -> str:
    cols = ("mutants", "killed", "survived", "no tests", "equivalent", "not run")
    lines = ["| module | " + " | ".join(cols) + " | kill rate |", "|---|" + "---:|" * (len(cols) + 1)]
    total: Counter = Counter()
    for module, c in rows.items():
        total.update(c)
        lines.append(f"| `{module}` | " + " | ".join(str(c[k]) for k in cols) + f" | {rate(c)} |")
    lines.append("| **all** | " + " | ".join(str(total[k]) for k in cols) + f" | {rate(total)} |")
    return "\n".join(lines)


def rate(c: Counter) -> str:
    judged = c["mutants"] - c["equivalent"] - c["not run"]
    return f"{100 * c['killed'] / judged:.1f} %" if judged else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help="dotted module or package names")
    p.add_argument("--all", action="store_true", help="every algorithm core")
    p.add_argument("--report", action="store_true", help="print the table, run nothing")
    args = p.parse_args()
    modules = list(CORES) if args.all else args.modules
    if not modules:
        p.error("name a module (e.g. osfl.fl.aggregators) or --all")
    if not args.report:
        for m in modules:
            done = subprocess.run(["mutmut", "run", f"{m}.*"], cwd=ROOT, check=False)
            if done.returncode not in (0, 1):
                return done.returncode
    print(table(results(modules)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
