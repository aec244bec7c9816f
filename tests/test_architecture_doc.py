"""docs/architecture.md is the map of the code: every path, module, class and
function it names must exist (a rename that forgets the page fails here).

What counts as a name, in the page's code spans:

- a path (``fl/runtime/rounds.py``, ``docs/flower.md``, ``flower/app/``),
  found under the repository, ``src/``, ``src/osfl/`` or one of its packages;
  a bare file name (``rounds.py``) anywhere under ``src/osfl`` or at the top
  of the repository, or, for what a run writes (``summary.md``), listed in
  docs/run-directory.md;
- ``file.py::name``: ``name`` defined in that file;
- a dotted name whose head is an osfl module (``osfl.fl.method.METHODS``,
  ``assembly.train_recipe``, ``privacy.defenses.DefendedMethod``): importable;
- a class-like identifier (``RoundLoop``, ``SharedTraining(model, cfg)``) or a
  call (``run_client(...)``): defined somewhere in ``src/osfl`` (or Flower's,
  for the few Flower names the page uses).

Config keys, option values and shell commands are not checked.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "osfl"
DOC = ROOT / "docs" / "architecture.md"
RUN_DIRECTORY_DOC = ROOT / "docs" / "run-directory.md"

#: Where a relative path in the page may start.
PATH_ROOTS = [
    ROOT,
    ROOT / "src",
    SRC,
    SRC / "fl",
    SRC / "fl" / "runtime",
    SRC / "flower",
    SRC / "methods",
    SRC / "privacy",
]
#: Flower's own names the page mentions (not osfl's to define).
FLOWER_NAMES = {"ClientApp", "ServerApp", "Grid", "Context", "SecAggPlusWorkflow", "ArrayRecord"}

_CAMEL = re.compile(r"^([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(\(.*\))?$")
_CALL = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][A-Za-z0-9_]*)*)\(.*\)$")
_DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_PATH = re.compile(r"^[\w./-]+(\.(py|md|yaml|json|toml)|/)(::\w+)?$")


def spans() -> list[str]:
    return sorted(set(re.findall(r"`([^`\n]+)`", DOC.read_text())))


@cache
def defined_names() -> frozenset[str]:
    """Every class, function and assigned name in src/osfl (any depth)."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return frozenset(names)


def defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
    return False


def find_path(text: str) -> Path | None:
    if "/" not in text.rstrip("/"):  # a bare file name: in the package, the repo, a run
        name = text.rstrip("/")
        found = sorted(SRC.rglob(name)) + sorted(ROOT.glob(name))
        if not found and f"`{text}`" in RUN_DIRECTORY_DOC.read_text():
            return RUN_DIRECTORY_DOC
        return found[0] if found else None
    for root in PATH_ROOTS:
        if (root / text).exists():
            return root / text
    return None


def resolves(dotted: str) -> bool:
    """``osfl.a.b.c`` or ``a.b.c`` (under ``osfl``) is a module or an attribute."""
    parts = dotted.split(".")
    if parts[0] != "osfl":
        parts = ["osfl", *parts]
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def is_osfl_module(head: str) -> bool:
    return head == "osfl" or (SRC / head).is_dir() or (SRC / f"{head}.py").is_file()


def problem(span: str) -> str | None:
    """Why ``span`` names something that does not exist (``None``: it exists,
    or it is not a name this test checks)."""
    if span in ("None", "True", "False"):
        return None
    if any(c in span for c in "<>*{} =,") and not _CAMEL.match(span) and not _CALL.match(span):
        return None  # templates, commands, overrides, prose
    if _PATH.match(span):
        file, _, name = span.partition("::")
        found = find_path(file)
        if found is None:
            return f"path {file!r} does not exist"
        if name and not defines(found, name):
            return f"{found.relative_to(ROOT)} defines no {name!r}"
        return None
    camel = _CAMEL.match(span)
    if camel:
        name = camel.group(1)
        ok = name in defined_names() or name in FLOWER_NAMES
        return None if ok else f"no class or function {name!r} in src/osfl"
    call = _CALL.match(span)
    if call:
        name = call.group(1)
        head = name.split(".")[0]
        if "." in name and is_osfl_module(head):
            return None if resolves(name) else f"{name!r} does not resolve"
        return None if name.split(".")[-1] in defined_names() else f"no function {name!r}"
    if _DOTTED.match(span) and is_osfl_module(span.split(".")[0]):
        return None if resolves(span) else f"{span!r} does not resolve"
    return None


def test_the_page_mentions_many_names() -> None:
    """The checker sees the page (a parse that found nothing would pass)."""
    checked = [s for s in spans() if problem(s) is None and (_PATH.match(s) or _CAMEL.match(s))]
    assert len(checked) > 100


def test_the_checker_finds_a_missing_name() -> None:
    assert problem("fl/runtime/nowhere.py") is not None
    assert problem("fl/runtime/rounds.py::NoSuchLoop") is not None
    assert problem("SecureRoundLoop") is not None
    assert problem("osfl.fl.method.SECURE_AGGREGATE") is not None
    assert problem("fl/runtime/rounds.py::RoundLoop") is None
    assert problem("run_client(method, run)") is None


def test_every_name_on_the_architecture_page_exists() -> None:
    wrong = [f"`{span}`: {why}" for span in spans() if (why := problem(span)) is not None]
    assert not wrong, "docs/architecture.md mentions:\n" + "\n".join(wrong)
