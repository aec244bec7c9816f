"""Methods from other installed packages: the ``osfl.methods`` entry-point group.

A package declares its method in its ``pyproject.toml``::

    [project.entry-points."osfl.methods"]
    vote = "osfl_vote:MajorityVote"

and ``osfl list``, ``osfl run 'methods=[vote]'``, ``osfl table`` and the
Flower apps find it with no import by hand: :data:`METHODS` loads the group's
entry points once, on its first read after every built-in is registered
(:meth:`osfl.registry.Registry.accept_plugins`), the way pytest finds its
plugins (``pytest11``) and Flower its apps. :func:`adopt_method` checks what
the registry and the commands rely on before the class joins it, so a
plugin's mistake is one line naming its entry point, never a traceback mid-run.
docs/adding-a-method.md walks through one.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from osfl.fl.method import Method, MethodCard
from osfl.fl.regimes import REGIMES, UPLOAD_KINDS
from osfl.registry import PluginError

#: The entry-point group a package puts its methods in.
METHOD_PLUGINS = "osfl.methods"


def _card_problem(card: Any) -> str | None:
    """What of a card ``osfl list`` and the tables cannot use, or ``None``."""
    if not isinstance(card, MethodCard):
        return "its card is not an osfl.fl.method.MethodCard"
    if not card.summary or "\n" in card.summary:
        return "its card has no one-line summary (what osfl list shows)"
    if card.regime not in REGIMES:
        return f"its card's regime {card.regime!r} is not one of {', '.join(REGIMES)}"
    if card.uploads not in UPLOAD_KINDS:
        return f"its card's uploads {card.uploads!r} is not one of {', '.join(UPLOAD_KINDS)}"
    return None


def adopt_method(name: str, obj: Any) -> type[Method]:
    """``obj`` (what entry point ``name`` loaded) as a registered method class:
    a concrete :class:`~osfl.fl.method.Method` subclass with a dataclass
    ``Config`` and a card ``osfl list`` can show. Its ``name`` becomes the
    entry point's (a class that registers itself under another is refused)."""
    if not (isinstance(obj, type) and issubclass(obj, Method)):
        raise PluginError(f"{obj!r} is not a subclass of osfl.fl.method.Method")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise PluginError(f"{obj.__name__} does not implement {missing}")
    own = vars(obj).get("name")
    if own is not None and own != name:
        raise PluginError(f"{obj.__name__} registers itself as {own!r}, not {name!r}")
    config = getattr(obj, "Config", None)
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise PluginError(f"{obj.__name__}.Config must be a dataclass of its options")
    why = _card_problem(getattr(obj, "card", None))
    if why is not None:
        raise PluginError(f"{obj.__name__}: {why}")
    obj.name = name
    return obj
