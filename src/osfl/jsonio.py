"""JSON that never refuses a result: every file osfl writes about a run
(``metrics.json``, ``events.jsonl``, ``audit.json``) goes through :func:`dumps`.

Strict JSON has no NaN or Infinity, and ``json.dumps(allow_nan=False)`` raises
on them — one NaN loss in a poisoned run's record would then lose every
finished record. Here non-finite floats become ``null`` (a reader sees "no
value", never a made-up number), numpy and torch values become plain Python,
anything else its ``str``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps", "plain"]


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
