"""What ``osfl suite run`` does around each step (issues #32, #40): where a
step's extra overrides go, its placeholders resolved, the pack pointed at,
a benchmark script run in this process, a finished step's outputs hashed
and checked again, the rows already in the repository, and the files the
suite writes (each under a temporary name, then moved into place).
"""

from __future__ import annotations

import math
import os
import runpy
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from osfl.errors import ConfigError
from osfl.suite.bundle import read_json
from osfl.suite.pack import packed_imagefolder, sha256_file
from osfl.suite.plan import Planned
from osfl.suite.steps import Step


def with_overrides(step: Step, argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``argv`` with ``extra`` added where they take effect: key=value
    overrides before the first option (argparse reads one run of
    positionals), the benchmark's options at the end (the last one wins)."""
    argv = list(argv)
    if step.kind == "mfu":
        return [*argv, *extra]
    at = next((i for i, a in enumerate(argv) if i > 0 and a.startswith("--")), len(argv))
    return [*argv[:at], *extra, *argv[at:]]


def resolve(argv: Sequence[str], values: Mapping[str, Path]) -> list[str]:
    out = []
    for a in argv:
        for key, value in values.items():
            a = a.replace("{" + key + "}", str(value))
        out.append(a)
    return out


def use_pack(pack_dir: Path | None, log: Callable[[str], None]) -> None:
    """Point ``OSFL_CIFAR10`` at the pack's image file (checked, read in
    memory by ``imagefolder:<file>.npz``) unless it already names a path
    that exists."""
    if pack_dir is None:
        return
    path = packed_imagefolder(pack_dir)
    if path is None:
        return
    current = os.environ.get("OSFL_CIFAR10")
    if current and Path(current).exists():
        log(f"OSFL_CIFAR10={current} exists: the pack's copy is not used")
        return
    os.environ["OSFL_CIFAR10"] = str(path)
    log(f"OSFL_CIFAR10={path} (the pack, read in memory)")


def free_gpu() -> None:
    # heavy: torch, only to hand a finished step's cached GPU memory back
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_script(argv: Sequence[str]) -> int:
    """A ``script`` step: ``PATH ARGS...``, the benchmark script's own
    ``main(ARGS)`` in this process (no new Python, no second CUDA start)."""
    path, *args = argv
    if not Path(path).is_file():
        raise ConfigError(f"{path} does not exist (run the suite from the repository root)")
    module = runpy.run_path(path, run_name="osfl_suite_script")
    rc = module["main"](list(args))
    return 0 if rc is None else int(rc)


def output_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under a finished step's directory, by relative path."""
    return {
        str(f.relative_to(root)): sha256_file(f) for f in sorted(root.rglob("*")) if f.is_file()
    }


def outputs_intact(p: Planned) -> str:
    """Why ``p``'s outputs can no longer be trusted ("" when they all match)."""
    if p.out is None or not p.outputs:
        return "no outputs recorded"
    root = Path(p.out)
    for rel, digest in p.outputs.items():
        f = root / rel
        if not f.is_file():
            return f"{f} is missing"
        if sha256_file(f) != digest:
            return f"{f} changed since the step finished"
    return ""


def rows_in_repo(repo: Path | None) -> dict[str, str]:
    """Step name -> the file of ``repo/reproduction/`` that already holds its
    rows (written by ``osfl suite import``)."""
    if repo is None:
        return {}
    found: dict[str, str] = {}
    for f in sorted((repo / "reproduction").glob("gpu_suite_*.json")):
        for entry in read_json(f, list):
            steps = entry.get("steps") if isinstance(entry, dict) else None
            for name in steps if isinstance(steps, list) else []:
                if isinstance(name, str):
                    found[name] = f"reproduction/{f.name}"
    return found


def fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_budget(minutes: float, *, what: str = "the budget", zero: bool = False) -> float:
    """``minutes`` if it is a finite positive number (or 0 where ``zero``),
    else one error line."""
    ok = isinstance(minutes, int | float) and math.isfinite(minutes)
    if not ok or minutes < 0 or (minutes == 0 and not zero):
        kind = "non-negative" if zero else "positive"
        raise ConfigError(f"{what} must be a {kind}, finite number of minutes, got {minutes}")
    return float(minutes)
