"""Semantic mutation testing: one-line bugs written from the papers, run against each method's tests.

mutmut changes operators and constants; it never exchanges two things of the
same type, so a test that feeds every role the same kind of input passes a
bug that swaps the student and the teacher. ``tests/mutation_semantic/*.yaml``
lists, per method, one-line bugs of the kinds a reader of the paper and the
authors' code would fear (exchanged roles, a dropped term, a wrong
normalisation, a parameter shared that should be per member, a wrong
direction), each an exact snippet of ``src/osfl`` and its replacement. This
script applies each to a copy of ``src/`` and runs that method's tests
against the copy; a bug the tests pass is a missing test (TESTING.md prints
the catch rate per method and why each survivor survives).

    python scripts/semantic_mutation.py                   # every list
    python scripts/semantic_mutation.py --method fedavg   # one method
    python scripts/semantic_mutation.py --check           # snippets still match, nothing run
    python scripts/semantic_mutation.py --json out.json   # per-bug results

A list file::

    method: fedavg
    tests: [tests/methods/fedavg]          # what runs against each bug
    bugs:
      - id: fedavg-uniform-weights
        file: src/osfl/methods/fedavg.py   # relative to the repository
        find: "the exact line(s) of the code"   # must occur exactly once
        replace: "the bug"
        why: "FedAvg weights clients by n_k (McMahan et al., Eq. 1)"
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LISTS = ROOT / "tests" / "mutation_semantic"


@dataclass(frozen=True)
class Bug:
    method: str
    id: str
    file: str
    find: str
    replace: str
    why: str
    tests: tuple[str, ...]


def load_bugs(lists: Path = LISTS) -> list[Bug]:
    """Every bug of every list, checked: fields present, ids unique."""
    bugs: list[Bug] = []
    for path in sorted(lists.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        tests = tuple(doc["tests"])
        for b in doc["bugs"]:
            bugs.append(
                Bug(doc["method"], b["id"], b["file"], b["find"], b["replace"], b["why"], tests)
            )
    ids = [b.id for b in bugs]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise SystemExit(f"duplicate bug ids: {sorted(dupes)}")
    return bugs


def apply(bug: Bug, root: Path) -> None:
    """Write ``bug`` into the file under ``root``; its snippet must occur once."""
    path = root / bug.file
    text = path.read_text()
    n = text.count(bug.find)
    if n != 1:
        raise ValueError(f"{bug.id}: the snippet occurs {n} times in {bug.file} (must be once)")
    if bug.find == bug.replace:
        raise ValueError(f"{bug.id}: the replacement equals the snippet")
    mutated = text.replace(bug.find, bug.replace)
    try:  # a bug that breaks the syntax is "caught" by every test: it proves nothing
        ast.parse(mutated)
    except SyntaxError as err:
        raise ValueError(f"{bug.id}: the bug leaves {bug.file} unparsable ({err.msg})") from None
    path.write_text(mutated)


def run_bug(bug: Bug, timeout: float) -> dict[str, object]:
    """Apply ``bug`` to a copy of src/ and run its tests there: caught when they fail."""
    with tempfile.TemporaryDirectory(prefix="osfl-semantic-") as tmp:
        copy = Path(tmp)
        shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
        apply(bug, copy)
        env = {**os.environ, "PYTHONPATH": str(copy / "src")}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", *bug.tests]
        t = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
            rc: int | None = done.returncode
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            rc, tail = None, ["timeout"]
        seconds = round(time.perf_counter() - t, 1)
    # pytest: 0 all passed (survived), 1 a test failed (caught), 5 nothing collected (an error)
    if rc == 5:
        raise SystemExit(f"{bug.id}: its tests {bug.tests} collected nothing")
    return {
        "method": bug.method,
        "id": bug.id,
        "caught": rc != 0,
        "seconds": seconds,
        "why": bug.why,
        "pytest": tail[0] if tail else "",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", action="append", help="only this method's list (repeatable)")
    p.add_argument("--check", action="store_true", help="check every snippet applies; run nothing")
    p.add_argument("--json", help="write the per-bug results here")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per bug's test run")
    args = p.parse_args(argv)
    bugs = [b for b in load_bugs() if not args.method or b.method in args.method]
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            for bug in bugs:
                (Path(tmp) / bug.file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ROOT / bug.file, Path(tmp) / bug.file)
                apply(bug, Path(tmp))
                shutil.copyfile(ROOT / bug.file, Path(tmp) / bug.file)
        print(f"{len(bugs)} bugs: every snippet occurs once and every bug parses")
        return 0
    results = []
    for bug in bugs:
        r = run_bug(bug, args.timeout)
        results.append(r)
        verdict = "caught  " if r["caught"] else "SURVIVED"
        print(f"{verdict} {bug.method:12} {bug.id} ({r['seconds']} s)", flush=True)
    print()
    print("| method | bugs | caught | rate |")
    print("|---|---:|---:|---:|")
    for method in sorted({str(r["method"]) for r in results}):
        mine = [r for r in results if r["method"] == method]
        caught = sum(bool(r["caught"]) for r in mine)
        print(f"| {method} | {len(mine)} | {caught} | {100 * caught / len(mine):.0f} % |")
    total = sum(bool(r["caught"]) for r in results)
    print(f"| all | {len(results)} | {total} | {100 * total / max(1, len(results)):.0f} % |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
