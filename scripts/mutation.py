"""Mutation testing of osfl's algorithm cores with mutmut (TESTING.md).

    python scripts/mutation.py osfl.fl.aggregators            # one module
    python scripts/mutation.py osfl.privacy.label_recovery    # a package
    python scripts/mutation.py --all                          # every core module
    python scripts/mutation.py --report osfl.fl.aggregators   # the table only
    python scripts/mutation.py osfl.privacy.label_recovery --tests "tests/privacy/label_recovery/*.py"

Runs ``mutmut run "<module>*"`` for each module (mutmut 3 runs, for each
mutant, only the fast tests that execute the mutated function, as its first
run traces them), then prints one row per source file: mutants, killed,
survived, no tests, timeouts, the mutants judged equivalent
(``tests/mutation_equivalent/*.txt``: one mutant name and a ``#`` reason per
line, one file per group of modules) and the kill rate of the non-equivalent
ones. ``mutmut show NAME``
prints a mutant's diff; ``mutmut results`` lists the survivors.

``--tests GLOB ...`` keeps, of the tests that reach a mutant's function, only
those in the named test files: a function every test reaches (a weighted
mean, an upload validator) otherwise reruns hundreds of end-to-end tests per
mutant, minutes each on 2 cores, where its module's own unit tests take a
second. The mutmut trace on disk stays whole (the filter applies to this
run only), so a module run without ``--tests`` later sees every test again.

mutmut is not a dependency of osfl: ``pip install mutmut==3.8.1``. It runs
in this process with one fix (:func:`patch_frame_walk`): mutmut 3.8.1 with
``max_stack_depth`` set aborts its tracing run on dataclass-generated code
(boxed/mutmut pull request 570, open); and one speed-up
(:func:`fast_workers`). ``process_isolation = "forkserver"`` in
``[tool.mutmut]`` is what makes a training module's results true: with
mutmut's default, every worker is forked from the process that ran the clean
tests, autograd refuses to run backward in it, and every mutant a training
test reaches counts as killed.
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import json
import os
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
    "osfl.fl.training",
    "osfl.fl.batched_training",
    "osfl.fl.tensor_fit",
    "osfl.fl.runtime.rounds",
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
    lines = [
        "| module | " + " | ".join(cols) + " | kill rate |",
        "|---|" + "---:|" * (len(cols) + 1),
    ]
    total: Counter = Counter()
    for module, c in rows.items():
        total.update(c)
        lines.append(f"| `{module}` | " + " | ".join(str(c[k]) for k in cols) + f" | {rate(c)} |")
    lines.append("| **all** | " + " | ".join(str(total[k]) for k in cols) + f" | {rate(total)} |")
    return "\n".join(lines)


def rate(c: Counter) -> str:
    judged = c["mutants"] - c["equivalent"] - c["not run"]
    return f"{100 * c['killed'] / judged:.1f} %" if judged else "-"


def patch_frame_walk() -> None:
    """mutmut 3.8.1's ``record_trampoline_hit`` counts a test for a function
    only within ``max_stack_depth`` frames of user code, resolving each frame's
    file with ``Path.resolve(strict=True)``; a frame whose code has no file
    (a dataclass's generated ``__init__``: ``"<string>"``) raises and aborts
    the tracing run. The same walk, a frame without a file counted as
    third-party code (boxed/mutmut pull request 570 makes the same change)."""
    # optional: mutmut is a tool of this script, not a dependency of osfl
    import mutmut.mutation.trampoline as trampoline
    import mutmut.stats as stats
    from mutmut.configuration import config
    from mutmut.state import state

    roots = config().resolved_mutated_source_paths
    ours: dict[str, bool] = {}  # filename -> a file of the mutated sources (code objects: bounded)

    def is_ours(filename: str) -> bool:
        if filename not in ours:
            path = Path(filename)
            ours[filename] = path.is_file() and any(r in path.resolve().parents for r in roots)
        return ours[filename]

    def record(name: str, caller: str | None = None) -> None:
        depth = config().max_stack_depth
        if depth != -1:
            frame = inspect.currentframe()
            while depth and frame:
                filename = frame.f_code.co_filename
                frame = frame.f_back
                if "pytest" in filename or "unittest" in filename:
                    break
                if is_ours(filename):
                    depth -= 1
            if not depth:
                return
        state()._stats.add(name)
        if caller is not None and config().track_dependencies:
            state().function_dependencies[name].add(caller)

    stats.record_trampoline_hit = record
    trampoline.record_trampoline_hit = record


def keep_only_tests(test_globs: list[str], pattern: str) -> None:
    """After mutmut loads its trace, drop the tests outside ``test_globs`` from
    the functions ``pattern`` names (this run's copy only; see the module
    docstring)."""
    import mutmut.__main__ as mutmut_main  # optional: see patch_frame_walk
    from mutmut.state import state

    load = mutmut_main.collect_or_load_stats

    def wanted(test: str) -> bool:
        path = test.split("::", 1)[0]
        return any(fnmatch.fnmatch(path, g) for g in test_globs)

    def load_then_filter(*args: object, **kwargs: object) -> None:
        load(*args, **kwargs)
        tests = state().tests_by_mangled_function_name
        for name in list(tests):
            if fnmatch.fnmatch(name, pattern):
                tests[name] = {t for t in tests[name] if wanted(t)}

    mutmut_main.collect_or_load_stats = load_then_filter


def fast_workers() -> None:
    """Make each mutant's forked worker cheap to start: about 1.5 s instead of
    10-20 s on two busy cores.

    ``process_isolation = "forkserver"`` (``[tool.mutmut]``) forks every worker
    from a server that never runs a test (a process that ran autograd's
    backward cannot run it in a forked child). Two costs would otherwise be
    paid again in every worker: the first optimizer a process builds imports
    ``torch._dynamo`` (8-12 s; imported here, before the server is forked,
    which runs no autograd), and pytest's session end runs ``gc.collect()``
    five times over the server's whole heap (6 s, each collection touching,
    so copying, every inherited page): the server freezes its heap after
    its warm-up (:func:`gc.freeze`), so a worker's collections see only its
    own objects."""
    import gc

    import torch._dynamo  # heavy: see the docstring
    from mutmut.runners.harness import PytestRunner  # optional: see patch_frame_walk

    del torch
    warm_up = PytestRunner.warm_up

    def warm_up_then_freeze(self: PytestRunner) -> None:
        warm_up(self)
        gc.freeze()

    PytestRunner.warm_up = warm_up_then_freeze  # type: ignore[method-assign]


def run_mutmut(
    pattern: str, test_globs: list[str] | None = None, max_children: int | None = None
) -> int:
    """``mutmut run PATTERN`` in this process (with :func:`patch_frame_walk`),
    each mutant against its tests in ``test_globs`` when given."""
    from mutmut.__main__ import cli  # optional: see patch_frame_walk

    fast_workers()
    patch_frame_walk()
    if test_globs:
        keep_only_tests(test_globs, pattern)
    try:
        children = ["--max-children", str(max_children)] if max_children else []
        cli(["run", *children, pattern], standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def mutant_pattern(module: str) -> str:
    """The mutmut names of ``module``'s mutants: ``<module>.*``; a package's own
    functions (``pkg/__init__.py``, named ``pkg.__init__`` here) are mutmut's
    ``pkg.x_<function>`` / ``pkg.xǁ<class>ǁ...``, so ``pkg.x*``."""
    package = module.removesuffix(".__init__")
    return f"{package}.x*" if package != module else f"{module}.*"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help="dotted module or package names")
    p.add_argument("--all", action="store_true", help="every algorithm core")
    p.add_argument("--report", action="store_true", help="print the table, run nothing")
    p.add_argument(
        "--max-children", type=int, help="mutants tested at once (default: the CPU count)"
    )
    p.add_argument(
        "--tests", nargs="+", metavar="GLOB", help="run each mutant only against these test files"
    )
    args = p.parse_args()
    modules = list(CORES) if args.all else args.modules
    if not modules:
        p.error("name a module (e.g. osfl.fl.aggregators) or --all")
    os.chdir(ROOT)  # mutmut reads pyproject.toml and writes mutants/ here
    if not args.report:
        for m in modules:
            code = run_mutmut(mutant_pattern(m), args.tests, args.max_children)
            if code not in (0, 1):
                return code
    print(table(results(modules)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
