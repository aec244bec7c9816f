"""A small name -> object registry used for datasets, partition schemes,
models, methods and attacks.

Registries, not ``if/elif`` on strings: each family registers its members with a
decorator, a duplicate name is refused at import time, and an unknown name is a
:class:`~osfl.errors.ConfigError` that suggests the closest ones ("did you
mean") and lists the valid ones.

A registry may also take members from other installed packages: after
:meth:`Registry.accept_plugins`, the first read loads the entry points of a
group (``importlib.metadata``; the packaging spec,
https://packaging.python.org/en/latest/specifications/entry-points/), as
pytest loads its plugins and Flower its apps. A plugin that fails to import,
is not of the registry's kind or takes a built-in's name is one line
(:class:`PluginError`) naming its entry point and package, never a traceback,
and never a silent fallback to the built-ins; ``OSFL_NO_PLUGINS=1`` leaves every
plugin out.
"""

from __future__ import annotations

import difflib
import os
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from osfl.errors import ConfigError, OsflError

T = TypeVar("T")

#: Set (to anything but ``""`` or ``0``) to load no plugin at all: a way past a broken one.
NO_PLUGINS_ENV = "OSFL_NO_PLUGINS"


class PluginError(OsflError):
    """An installed plugin cannot join its registry (it fails to import, is
    not of the registry's kind, or takes a name already taken). Exit status 2."""


def _entry_point_label(ep: EntryPoint) -> str:
    """``entry point 'vote = osfl_vote:MajorityVote' (group osfl.methods) of osfl-vote 0.1.0``."""
    dist = getattr(ep, "dist", None)
    where = f" of {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point '{ep.name} = {ep.value}' (group {ep.group}){where}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


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
        #: name -> where a plugin member came from (its entry point and package)
        self._origins: dict[str, str] = {}
        self._group: str | None = None
        self._adopt: Callable[[str, Any], T] | None = None
        self._plugin_error: PluginError | None = None
        self._loading = False
        self._lock = threading.RLock()  # one load, even if two threads read first

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

    # ------------------------------------------------------------------ plugins
    def accept_plugins(self, group: str, adopt: Callable[[str, Any], T]) -> None:
        """Take members from the installed packages' entry points of ``group``,
        loaded once, on the next read (:meth:`get`, :meth:`names`, ``in``,
        iteration): call this once every built-in member is registered, so that
        a clash with a built-in is always seen. ``adopt(name, obj)`` checks a
        loaded object and returns the member to register (it raises
        :class:`PluginError`, or any exception, to refuse it)."""
        with self._lock:
            self._group, self._adopt = group, adopt

    def origin(self, name: str) -> str | None:
        """Where plugin member ``name`` came from (its entry point and
        package); ``None`` for a built-in."""
        self._load_plugins()
        return self._origins.get(name.lower())

    def _load_plugins(self) -> None:
        """Load the pending plugins (once), or raise the error that stopped them."""
        if self._group is None and self._plugin_error is None:  # nothing pending: no lock
            return
        with self._lock:  # another thread's first read waits for this one's load
            if self._plugin_error is not None:
                raise self._plugin_error
            group, adopt = self._group, self._adopt
            if group is None or adopt is None or self._loading:
                return  # (loading: a plugin that reads this registry sees it as it is)
            self._loading = True
            try:
                if os.environ.get(NO_PLUGINS_ENV, "") in ("", "0"):
                    for ep in sorted(entry_points(group=group), key=lambda e: (e.name, e.value)):
                        self._load_one(ep, adopt)
            except PluginError as e:
                self._plugin_error = e
                raise
            finally:
                self._loading, self._group = False, None

    def _load_one(self, ep: EntryPoint, adopt: Callable[[str, Any], T]) -> None:
        """Import one entry point and register what it names under its name."""
        label, key = _entry_point_label(ep), ep.name.lower()
        fix = f"(fix or uninstall it, or set {NO_PLUGINS_ENV}=1 to run without plugins)"
        if key in self._items:  # refused before its code runs
            other = self._origins.get(key)
            taken = f"a built-in {self.kind}" if other is None else f"the {self.kind} of {other}"
            raise PluginError(
                f"plugin {label} takes the name {key!r} of {taken}: rename its entry point {fix}"
            )
        try:
            obj = ep.load()
            if isinstance(obj, types.ModuleType):  # a module that registers on import
                if key not in self._items:
                    raise PluginError(f"it registers no {self.kind} named {key!r}")
                obj = self._items.pop(key)
            member = adopt(key, obj)
        except PluginError as e:
            raise PluginError(f"plugin {label} is refused: {e} {fix}") from None
        except ValueError as e:
            if str(e).startswith(f"duplicate {self.kind} name"):  # registered a taken name
                raise PluginError(f"plugin {label} is refused: {e} {fix}") from None
            raise PluginError(f"plugin {label} failed to load: {_first_line(e)} {fix}") from None
        except Exception as e:  # its import or its class: the author's bug, said in one line
            raise PluginError(f"plugin {label} failed to load: {_first_line(e)} {fix}") from None
        if self._items.get(key, member) is not member:
            raise PluginError(f"plugin {label} is refused: {key!r} is already a {self.kind} {fix}")
        self._items[key] = member
        self._origins[key] = label

    # ------------------------------------------------------------------ reading
    def get(self, name: str) -> T:
        self._load_plugins()
        key = name.lower()
        if key not in self._items:
            valid = ", ".join(sorted(self._items)) or "(none)"
            hint = did_you_mean(key, self._items)
            raise ConfigError(f"unknown {self.kind} {name!r}{hint}; valid: {valid}")
        return self._items[key]

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._items)
