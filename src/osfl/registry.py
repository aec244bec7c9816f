"""A small name -> object registry used for datasets, partition schemes,
models, methods and attacks.

Registries, not ``if/elif`` on strings: each family registers its members with a
decorator, a duplicate name is refused at import time, and an unknown name is a
:class:`~osfl.errors.ConfigError` that suggests the closest ones ("did you
mean") and lists the valid ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from osfl.errors import ConfigError

T = TypeVar("T")


def did_you_mean(name: str, valid: Iterable[str], prefix: str = "") -> str:
    """``" (did you mean 'fedavg'?)"`` for the valid names closest to ``name``
    (difflib's ratio >= 0.6, at most three, closest first, each shown after
    ``prefix``), or ``""``."""
    close = difflib.get_close_matches(name.lower(), list(valid), n=3)
    close = [repr(prefix + c) for c in close]
    if not close:
        return ""
    names = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f" (did you mean {names}?)"


class Registry(Generic[T]):
    """Maps lowercase names to objects of one kind (classes or factories)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")``. Duplicate names raise."""

        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        key = name.lower()
        if key in self._items:
            raise ValueError(f"duplicate {self.kind} name {name!r}")
        self._items[key] = obj

    def get(self, name: str) -> T:
        key = name.lower()
        if key not in self._items:
            valid = ", ".join(sorted(self._items)) or "(none)"
            hint = did_you_mean(key, self._items)
            raise ConfigError(f"unknown {self.kind} {name!r}{hint}; valid: {valid}")
        return self._items[key]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
