"""docs/architecture.md is the map of the code: every path, module, class and
function it names must exist (a rename that forgets the page fails here).

What counts as a name, in the page's code spans:

- a path (``fl/runtime/rounds.py``, ``docs/flower.md``, ``flower_app/``),
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

Two statements are checked against the code rather than by name: the layer
order (the page's layer table, design.md's and tests/docs/test_imports.py's own
``a → b → c`` chains) against ``tests/support/layers.py::LAYERS``, the one place
that declares it; and the page's list of commands against the parser
``osfl.cli.build_parser`` builds.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from functools import cache
from pathlib import Path

from osfl.cli import build_parser
from support.layers import LAYERS, layer  # the one statement of the layer order
from support.paths import ROOT

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


# ---- the layer order: one statement (tests/support/layers.py::LAYERS), checked here


DESIGN_DOC = ROOT / "docs" / "design.md"
IMPORTS_TEST = Path(__file__).with_name("test_imports.py")


def layer_table() -> dict[int, list[str]]:
    """docs/architecture.md's layer table: rank -> the modules its row names
    (``data/`` -> ``osfl.data``, ``flower_app/`` -> ``osfl.flower_app``)."""
    text = DOC.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    table: dict[int, list[str]] = {}
    for rank, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.M):
        names = re.findall(r"`([\w/]+?)(?:\.py|/)`", cell)
        table[int(rank)] = ["osfl." + n.replace("/", ".") for n in names]
    return table


def stated_order(text: str) -> list[list[str]]:
    """The first chain ``a → b/c → d`` in ``text`` (asides in parentheses and
    backticks ignored): its groups of module names, bottom first."""
    flat = re.sub(r"\s*\([^()]*\)", "", " ".join(text.split())).replace("`", "")
    name = r"\w+(?:\.\w+)*"
    group = rf"{name}(?:/{name})*"
    found = re.search(rf"{group}(?: → {group})+", flat)
    assert found, "no chain 'a → b → c' found"
    return [["osfl." + n for n in group.split("/")] for group in found.group(0).split(" → ")]


def order_problems(groups: list[list[str]]) -> list[str]:
    """How a stated order differs from ``LAYERS``: a group whose modules lie in
    different layers, a step that does not go up by exactly one layer, a layer
    (above the base, 0) that the chain skips."""
    problems = []
    ranks = []
    for group in groups:
        here = {m: layer(m) for m in group}
        if len(set(here.values())) != 1:
            problems.append(f"{'/'.join(group)} spans layers {here}")
        ranks.append(min(here.values()))
    expected = sorted({rank for _, rank in LAYERS if rank > 0})
    if ranks != expected:
        problems.append(f"layers in the stated order {ranks}, LAYERS has {expected}")
    return problems


def test_the_layer_table_is_the_order_test_imports_enforces() -> None:
    table = layer_table()
    assert sorted(table) == sorted({rank for _, rank in LAYERS}), "one row per layer"
    wrong = [
        f"{m} is in row {rank}, LAYERS puts it in {layer(m)}"
        for rank, mods in table.items()
        for m in mods
        if layer(m) != rank
    ]
    named = {m for mods in table.values() for m in mods}
    missing = [p for p, _ in LAYERS if p not in named]
    assert not wrong and not missing, "\n".join(wrong + [f"{p}: no row names it" for p in missing])


def test_design_and_test_imports_state_the_same_order() -> None:
    for path in (DESIGN_DOC, IMPORTS_TEST):
        text = path.read_text()
        if path == DESIGN_DOC:
            text = text.split("## 3. Layout", 1)[1]
        problems = order_problems(stated_order(text))
        assert not problems, f"{path.name}: " + "; ".join(problems)


def test_the_order_checker_finds_a_wrong_order() -> None:
    """design.md once put config/report below the Flower adapters."""
    wrong = "data → models → fl → config/report → flower → methods"
    assert order_problems(stated_order(wrong))
    assert order_problems(stated_order("data → models/fl"))
    assert stated_order("x (aside → no) a → `b`/c (why) → d.") == [
        ["osfl.a"],
        ["osfl.b", "osfl.c"],
        ["osfl.d"],
    ]


# ---- the CLI: the commands the page lists are the parser's


def parser_commands() -> set[str]:
    """Every command ``osfl`` parses, sub-commands spelt out (``suite run``)."""
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.add(prefix)
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def documented_commands() -> set[str]:
    """The commands the page's ``osfl a / b / c d`` span lists."""
    listed = [s for s in spans() if s.startswith("osfl ") and " / " in s]
    assert len(listed) == 1, f"expected one command list on the page, got {listed}"
    return {c.strip() for c in listed[0].removeprefix("osfl ").split(" / ")}


def test_the_page_lists_exactly_the_cli_commands() -> None:
    documented, parsed = documented_commands(), parser_commands()
    assert documented == parsed, (
        f"on the page, not in the parser: {sorted(documented - parsed)}; "
        f"in the parser, not on the page: {sorted(parsed - documented)}"
    )


def shown_commands(text: str) -> set[str]:
    """The commands a page shows as code (a ``osfl ...`` span or a line of a
    code block), spelt as :func:`parser_commands` spells them: ``osfl suite
    pack --wheels`` -> ``suite pack``."""
    groups = {c.split()[0] for c in parser_commands() if " " in c}
    lines = re.findall(r"`(osfl [^`\n]+)`", text)
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        lines += [ln.strip() for ln in block.splitlines()]
    found = set()
    for line in lines:
        for words in re.findall(r"(?:^|&& |; )osfl ([a-z][\w-]*)(?: ([a-z][\w-]*))?", line):
            found.add(" ".join(words) if words[0] in groups else words[0])
    return found


def test_the_readme_shows_only_commands_the_parser_has() -> None:
    """README.md has no command table: every command it shows as code exists."""
    shown = shown_commands((ROOT / "README.md").read_text())
    assert shown, "the README shows no osfl command"
    assert shown <= parser_commands(), f"not in the parser: {sorted(shown - parser_commands())}"
    assert shown_commands("`osfl suite pack --wheels`\n```\nosfl nosuch x\n```\n") == {
        "suite pack",
        "nosuch",
    }
