"""A SuperNode's ``--node-config`` string, written so that Flower's parser
reads back exactly the entries given (``flwr/common/config.py::parse_config_args``
ends a double-quoted value at the next ``"``, so values are escaped TOML
strings), and the keys :class:`~osfl.flower_app.local.LocalFederation` sets
itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from osfl.errors import ConfigError

NodeConfigValue = str | int | float

#: Node-config keys :class:`LocalFederation` sets itself (node ``i`` plays client ``i``).
RESERVED_NODE_KEYS = ("partition-id", "num-partitions")
_NODE_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def _toml_string(value: str) -> str:
    """A TOML basic string that Flower's ``--node-config`` parser reads back
    as ``value``: its tokenizer (``flwr/common/config.py::parse_config_args``,
    ``(\\S+?)=('[^']*'|"[^"]*"|\\S+)``) ends a double-quoted value at the next
    ``"``, so quotes, backslashes and control characters are escaped
    (``\\u0022``, ``\\\\``, ``\\uXXXX``) rather than written."""
    out = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"' or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def node_config_string(entries: Mapping[str, NodeConfigValue]) -> str:
    """``entries`` as one ``flower-supernode --node-config`` string
    (``key=value`` pairs, space-separated, values in TOML syntax: strings
    double-quoted and escaped, so spaces and quotes survive; ``bool`` as
    ``true``/``false``). Keys are bare TOML keys (letters, digits, ``_``,
    ``-``, dotted parts)."""
    parts = []
    for key, value in entries.items():
        if not isinstance(key, str) or not _NODE_KEY.fullmatch(key):
            raise ConfigError(
                f"node-config key {key!r} must be letters, digits, '_' or '-' "
                "(dot-separated parts allowed)"
            )
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(f"node-config {key!r} must be finite, got {value}")
            text = repr(value)
        elif isinstance(value, str):
            text = _toml_string(value)
        else:
            raise ConfigError(
                f"node-config {key!r} must be a str, int, float or bool, got {type(value).__name__}"
            )
        parts.append(f"{key}={text}")
    for key in entries:  # TOML cannot hold both a.b=1 and a=2
        clash = [p for p in entries if p != key and key.startswith(p + ".")]
        if clash:
            raise ConfigError(f"node-config keys {clash[0]!r} and {key!r} clash (a.b nests in a)")
    return " ".join(parts)
