"""Data flows one way: no import cycle anywhere in ``src/osfl`` (function-level
and ``TYPE_CHECKING`` imports included), every import goes down the layers
data → models → fl → flower (adapters) → config/report/rundir →
methods/privacy/pretrain → assembly → experiment → runner → cli/commands/flower_app,
nothing in ``osfl.fl`` (or below) imports ``flwr``, and every module imports in
a fresh interpreter.

Run on its own: ``python -m pytest -q tests/docs/test_imports.py``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from support.layers import layer
from support.paths import ROOT

SRC = ROOT / "src"


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "osfl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the osfl modules it imports (any statement, any depth)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from a.b import c` imports the submodule a.b.c when there is one
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            for t in targets:
                if t.startswith("osfl"):
                    r = resolve(t)
                    if r is not None and r != mod:
                        graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere() -> None:
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


def test_every_import_goes_down_the_layers() -> None:
    upward = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, targets in import_graph().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not upward, "\n".join(upward)


def test_flower_is_an_adapter_layer_above_the_core() -> None:
    """Only ``osfl.flower`` (the adapters) and ``osfl.flower_app`` (the apps,
    on the top layer) import ``flwr`` (``flwr_datasets``, Flower's
    partitioners, is a separate package the data layer wraps)."""
    offenders = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            in_flower = mod.split(".")[:2] in (["osfl", "flower"], ["osfl", "flower_app"])
            if not in_flower and any(n == "flwr" or n.startswith("flwr.") for n in names):
                offenders.append(mod)
    assert not offenders, (
        f"modules outside osfl.flower and osfl.flower_app import flwr: {sorted(set(offenders))}"
    )


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The two checks above can fail: a planted cycle and upward edge are found."""
    graph = {"osfl.fl.a": {"osfl.fl.b"}, "osfl.fl.b": {"osfl.fl.a"}, "osfl.data.x": set()}
    assert cycles(graph) == [["osfl.fl.a", "osfl.fl.b"]]
    assert layer("osfl.data.x") < layer("osfl.fl.a")


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """A new Python process imports every module (an import-time error, e.g. a
    name that moved, fails here); import order cannot matter because the graph
    has no cycle (above)."""
    names = sorted(modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


#: Why an import may sit inside a function, as its comment says it
#: (``# heavy: matplotlib``, ``# optional: flwr``). Breaking a cycle is no
#: reason: the cycle check above counts function-level imports too.
IMPORT_REASONS = ("heavy", "optional")
_REASON = re.compile(r"#.*\b(?:" + "|".join(IMPORT_REASONS) + r"):")


def untagged_imports(source: str) -> list[int]:
    """Lines of the function-level imports in ``source`` that say no reason:
    none of :data:`IMPORT_REASONS` on the import's own lines or in the comment
    block directly above it."""
    lines = source.splitlines()
    found: set[int] = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            said = lines[node.lineno - 1 : node.end_lineno]
            above = node.lineno - 2
            while above >= 0 and lines[above].lstrip().startswith("#"):
                said.append(lines[above])
                above -= 1
            if not any(_REASON.search(line) for line in said):
                found.add(node.lineno)
    return sorted(found)


def test_every_function_level_import_says_why() -> None:
    """A function-level import is a cost (a hidden dependency, a slower first
    call); it is kept only for a heavy or optional dependency, and says which
    where it stands."""
    root = SRC.parent
    found = {
        str(path.relative_to(root)): untagged_imports(path.read_text())
        for path in modules().values()
    }
    untagged = [f"{file}:{line}" for file, lines in found.items() for line in lines]
    assert not untagged, "function-level imports with no '# heavy:' / '# optional:':\n" + "\n".join(
        untagged
    )


def test_the_tag_checker_finds_an_untagged_import() -> None:
    source = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    # heavy: torch\n"
        "    import torch\n"
        "    from PIL import Image  # optional: Pillow\n"
        "    import sys  # noqa: F401\n"
    )
    assert untagged_imports(source) == [3, 7]
