"""The tests mirror the tree (TESTING.md, "Where a feature's tests live"):
every package of ``src/osfl`` has its folder of tests, every top-level module
its ``tests/test_<module>.py``, a top-level test file names a module that
exists, the tiny tasks are defined in ``tests/support`` only, and no test
module imports another (what two share is in ``tests/support`` or a
``conftest.py``). A newcomer then finds a feature's tests beside its code in
one jump."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.paths import ROOT

SRC = ROOT / "src" / "osfl"
TESTS = ROOT / "tests"
#: Folders of tests/ that hold no tests of a package.
NOT_MIRRORS = {"docs", "fixtures", "support", "mutation_equivalent", "mutation_semantic"}
#: The task keys: an override list that sets three of them defines a tiny task.
TASK_KEY = re.compile(r"^(data|model|partition)\.[a-z_.]+=")


def packages() -> list[Path]:
    """Every package under src/osfl, relative to it (``flower_app``, ``fl/runtime``, ...)."""
    return sorted(p.parent.relative_to(SRC) for p in SRC.rglob("__init__.py") if p.parent != SRC)


def top_level_modules() -> list[str]:
    return sorted(p.stem for p in SRC.glob("*.py") if not p.stem.startswith("__"))


def _test_files() -> list[Path]:
    return sorted(
        p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.relative_to(TESTS).parts
    )


def test_every_package_has_its_folder_of_tests() -> None:
    missing = [
        f"src/osfl/{p}/ has no tests/{p}/test_*.py"
        for p in packages()
        if not list((TESTS / p).glob("test_*.py"))
    ]
    assert not missing, missing


def test_every_top_level_module_has_its_test_file() -> None:
    missing = [m for m in top_level_modules() if not (TESTS / f"test_{m}.py").is_file()]
    assert not missing, [f"src/osfl/{m}.py has no tests/test_{m}.py" for m in missing]


def test_a_top_level_test_file_or_folder_names_what_it_tests() -> None:
    """tests/test_<m>.py for a module ``m`` of src/osfl; a folder of tests/ for
    a package (or a place of its own: docs, fixtures, support, the mutation lists)."""
    modules = set(top_level_modules())
    stray = [p.name for p in TESTS.glob("test_*.py") if p.stem.removeprefix("test_") not in modules]
    roots = {p.parts[0] for p in packages()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    stray += sorted(f"{f}/" for f in folders - roots - NOT_MIRRORS)
    assert not stray, stray


def test_a_test_folder_mirrors_a_package_or_a_method() -> None:
    """Below the top level too: tests/<p>/<q>/ is src/osfl/<p>/<q>/ or, under
    tests/methods/, one method family (src/osfl/methods/<name>.py or package)."""
    pkgs = {str(p) for p in packages()}
    methods = {p.stem for p in (SRC / "methods").glob("*.py")} | {
        p.name for p in (SRC / "methods").iterdir() if p.is_dir()
    }
    stray = []
    for d in sorted(TESTS.rglob("*/")):
        rel = d.relative_to(TESTS)
        if rel.parts[0] in NOT_MIRRORS or "__pycache__" in rel.parts or len(rel.parts) < 2:
            continue
        if rel.parts[0] == "methods" and len(rel.parts) == 2 and rel.parts[1] in methods:
            continue
        if str(rel) not in pkgs:
            stray.append(f"tests/{rel}/")
    assert not stray, stray


def tiny_tasks(path: Path) -> list[str]:
    """Each list or tuple literal of ``path`` that sets three task keys or more
    (``data.*``, ``model.*``, ``partition.*`` as plain strings), by line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List | ast.Tuple):
            keys = {
                e.value.split("=")[0]
                for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
                if TASK_KEY.match(e.value)
            }
            if len(keys) >= 3:
                name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{name}:{node.lineno}: {sorted(keys)}")
    return found


def test_tiny_tasks_are_defined_in_tests_support_only() -> None:
    """One name per task, in ``support/tiny.py`` (or a family's support module):
    a test adds what it changes to a named task (``[*TINY_FLOWER, "methods=[fedavg]"]``)."""
    found = [t for p in _test_files() + sorted(TESTS.rglob("conftest.py")) for t in tiny_tasks(p)]
    found = [t for t in found if not t.startswith("tests/fixtures/")]
    assert not found, found


def test_the_task_scan_finds_a_task_written_out(tmp_path: Path) -> None:
    """The scan above is not vacuous: an inline task is found, a named one is not."""
    inline = tmp_path / "test_x.py"
    inline.write_text(
        'ARGS = ["data.image_size=8", "partition.num_clients=2", "partition.alpha=1.0", "x=1"]\n'
        'NAMED = [*TINY, "data.image_size=16", f"data.source={1}", "train.epochs=1"]\n'
    )
    assert tiny_tasks(inline) == [
        "test_x.py:1: ['data.image_size', 'partition.alpha', 'partition.num_clients']"
    ]


def test_no_test_module_imports_another() -> None:
    """What two test files share is in tests/support (``support.*``) or a
    conftest.py fixture, never in a test module another imports."""
    names = {p.stem for p in _test_files()}
    bad = []
    for p in _test_files() + sorted((TESTS / "support").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.level:
                mods = [node.module or "."]
            for m in mods:
                if m.startswith("tests.") or m.split(".")[-1] in names or m == ".":
                    bad.append(f"{p.relative_to(ROOT)}: imports {m}")
    assert not bad, bad
