"""The code a run was made with: osfl's git commit, when it runs from a checkout.

``osfl_version`` says which release; a research checkout changes between
releases, so a record names the commit and whether the tree had uncommitted
changes (issue "What a researcher expects, round three", item 3). Outside a
git checkout (an installed wheel) there is no commit to name: ``None``.
Reading it never fails a run: any problem (no git, a timeout) is ``None``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

#: the source tree this module was loaded from (src/osfl in a checkout)
PACKAGE_DIR = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def code_version() -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the checkout osfl runs from
    (``dirty``: uncommitted changes under the package), or ``None``."""
    if _git("rev-parse", "--is-inside-work-tree") != "true":
        return None
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git("status", "--porcelain", "--", ".")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
