"""What the plugin tests share (``tests/methods/test_plugins.py``, methods
from another package; ``tests/test_registry.py``, the registry's generic
hook): a package's installed metadata made by hand, and a module written
onto a folder of sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

from osfl.methods.plugins import METHOD_PLUGINS


def install_metadata(site: Path, dist: str, entry_points: dict[str, str]) -> Path:
    """``site/<dist>-0.1.0.dist-info``: the metadata pip writes for an installed
    package, with its ``osfl.methods`` entry points; ``site`` goes on sys.path."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = [f"[{METHOD_PLUGINS}]", *(f"{k} = {v}" for k, v in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info


def write_module(site: Path, name: str, source: str) -> None:
    (site / f"{name}.py").write_text(source)
    sys.modules.pop(name, None)
