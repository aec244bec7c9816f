"""Sweeps: ``--sweep key=v1,v2`` axes expanded into a grid of override sets."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from osfl.errors import ConfigError


def _split_values(text: str) -> list[str]:
    """Split ``v1,v2,[a,b]`` on top-level commas (brackets group)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v.strip() for v in out if v.strip()]


LIST_KEYS = ("seeds", "methods")


def expand_sweeps(sweeps: Sequence[str]) -> list[dict[str, str]]:
    """``["partition.alpha=0.1,1.0", "seeds=0,1"]`` -> the grid of override dicts.

    For the list-valued keys (``seeds``, ``methods``) one sweep value ``v``
    becomes ``[v]``, so a seed sweep is a grid dimension like any other and the
    report still averages over seeds.
    """
    axes: list[list[tuple[str, str]]] = []
    seen: set[str] = set()
    for s in sweeps:
        key, sep, values = s.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ConfigError(
                f"--sweep {s!r} must look like key=v1,v2 (e.g. partition.alpha=0.1,1.0)"
            )
        if key in seen:
            raise ConfigError(f"--sweep names {key!r} twice; give all its values in one --sweep")
        seen.add(key)
        vals = _split_values(values)
        if key in LIST_KEYS:
            vals = [v if v.startswith("[") else f"[{v}]" for v in vals]
        axes.append([(key, v) for v in vals])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def merge_sweeps(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The config's sweep axes with ``extra`` (the command line's) replacing
    axes of the same key and adding new ones."""
    keys = {s.partition("=")[0].strip() for s in extra}
    return [s for s in base if s.partition("=")[0].strip() not in keys] + list(extra)


def sweep_label(point: Mapping[str, str]) -> str:
    """A short human label for a grid point, e.g. ``partition.alpha=0.1``."""
    return " ".join(f"{k}={v}" for k, v in point.items() if k != "seeds")
