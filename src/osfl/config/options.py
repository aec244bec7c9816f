"""The options of a config dataclass as users read them (``osfl list --method NAME``).

Each option's description is its ``#:`` doc comment (Sphinx's form) in the
dataclass's source, parsed once per class; defaults are shown as YAML text.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class OptionDoc:
    """One option of a config tree: its dotted ``key``, its ``default`` as YAML
    text and its one-line ``help`` (``""`` when undocumented)."""

    key: str
    default: str
    help: str


@functools.cache
def _doc_comments(klass: type) -> dict[str, str]:
    """The ``#:`` doc comments (Sphinx's form) on the lines right above each field
    declared in ``klass``'s own body, joined into one line each."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # no source (a class made at run time)
        return {}
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    out = {}
    for node in body.body if isinstance(body, ast.ClassDef) else []:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            i, words = node.lineno - 2, []
            while i >= 0 and lines[i].strip().startswith("#:"):
                words.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if words:
                out[node.target.id] = " ".join(words)
    return out


def option_docs(config_cls: type) -> dict[str, str]:
    """Field name -> its ``#:`` doc comment, for ``config_cls`` and its dataclass
    bases (a subclass that redeclares a field to change its default keeps the
    base's description unless it writes its own)."""
    docs: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_doc_comments(klass))
    return docs


def default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's default (its factory called), or ``dataclasses.MISSING``."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _yaml_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, tuple):
        value = list(value)
    text = str(yaml.safe_dump(value, default_flow_style=True, width=10_000))
    return text.strip().removesuffix("\n...").strip()


def config_options(config_cls: type, prefix: str = "") -> list[OptionDoc]:
    """Every leaf option of a config dataclass, nested groups as dotted keys
    (``distill.lr``), in declaration order, with its default and description
    (``osfl list --method NAME``)."""
    docs = option_docs(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        default = default_of(f)
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            out += _group_options(type(default), default, f"{prefix}{f.name}.")
            continue
        out.append(OptionDoc(f"{prefix}{f.name}", _yaml_value(default), docs.get(f.name, "")))
    return out


def _group_options(group_cls: type, default: Any, prefix: str) -> list[OptionDoc]:
    """A nested group's options with the defaults its parent gives it (e.g.
    DENSE's own ``distill.lr``, not :class:`DistillConfig`'s)."""
    return [
        dataclasses.replace(o, default=_yaml_value(_nested(default, o.key[len(prefix) :])))
        for o in config_options(group_cls, prefix)
    ]


def _nested(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
