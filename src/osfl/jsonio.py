"""JSON in and out of osfl.

Out: JSON that never refuses a result: every file osfl writes about a run
(``metrics.json``, ``events.jsonl``, ``audit.json``) goes through :func:`dumps`.
Strict JSON has no NaN or Infinity, and ``json.dumps(allow_nan=False)`` raises
on them — one NaN loss in a poisoned run's record would then lose every
finished record. Here non-finite floats become ``null`` (a reader sees "no
value", never a made-up number), numpy and torch values become plain Python,
anything else its ``str``.

In: JSON that never ends a round: everything osfl reads from a peer or a file
it did not just write goes through :func:`loads`, which bounds the text's size
and nesting depth before parsing. ``json.loads`` recurses per nesting level,
so a 2 KB message nested 1,000 deep raises ``RecursionError`` — no
``ValueError`` handler catches it, and one client's metadata used to end the
round for everyone. Every refusal here is a :class:`ValueError`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "JSONBoundError", "dumps", "loads", "plain"]

#: The deepest nesting :func:`loads` accepts by default: osfl's own documents
#: nest a handful of levels; a record with per-round metrics about ten.
MAX_DEPTH = 64

#: A JSON string literal (escapes included), removed before counting brackets.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


class JSONBoundError(ValueError):
    """JSON text over :func:`loads`' size or depth bound."""


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of JSON ``text`` (brackets inside
    strings do not count), found without recursion."""
    depth = deepest = 0
    for b in _BRACKET.findall(_STRING.sub('""', text)):
        depth += 1 if b in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """``json.loads(text)`` for text from a peer or a file: a
    :class:`JSONBoundError` (a ``ValueError``) when it is longer than
    ``max_chars`` or nests deeper than ``max_depth``, else what ``json.loads``
    gives (its own ``ValueError`` on malformed text)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")  # UnicodeDecodeError is a ValueError
    if max_chars is not None and len(text) > max_chars:
        raise JSONBoundError(f"JSON text of {len(text)} characters, more than {max_chars}")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JSONBoundError(f"JSON nested {depth} levels deep, more than {max_depth}")
    return json.loads(text)


def plain(x: Any) -> Any:
    """``x`` as JSON-able Python: containers recursed, non-finite floats -> ``None``."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [plain(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalars and arrays, torch tensors
        return plain(x.tolist())
    return str(x)


def dumps(x: Any, **kwargs: Any) -> str:
    """Strict JSON of :func:`plain` ``(x)`` (``kwargs`` as for ``json.dumps``)."""
    return json.dumps(plain(x), allow_nan=False, **kwargs)
