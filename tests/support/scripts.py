"""Load a repository script (``benchmarks/*.py``, ``scripts/*.py``) as a module:
they are not in the ``osfl`` package, and their tests check the functions that
REPRODUCTION's and the docs' tables are made by."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import ROOT


def load_script(relative: str) -> ModuleType:
    """The script at ``ROOT / relative``, executed once per call, registered in
    ``sys.modules`` under its stem (dataclasses look their module up there)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
