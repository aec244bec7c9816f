"""The first minute of a job proves the GPU path (issue #50).

Before any step, ``osfl suite run`` imports every module the catalogue's
commands need (:data:`IMPORTS`, ``datasets`` and ``flwr_datasets``
included, and each benchmark script a step runs) and then runs every
registered method once on the job's device, on a tiny task: 8-px digits,
2 clients, one local epoch of a few batches, the method's own ``smoke``
overrides (fewer server epochs, a small ViT where it needs one), bf16
autocast on. On a GPU that is the training step's CUDA path (fused
optimizers, channels_last with cuDNN's autotuner, augmentations drawn on
the device, bf16 autocast) in every method, in well under
:data:`BUDGET_S`: the methods the catalogue runs go first, and a method not
reached within the budget is listed, not failed. The device-placement
tests (``tests/fl/test_device_placement.py``) check the same on a CPU with
a simulated device, which cannot take the ``device.type == "cuda"``
branches; this is where those branches first run.

A failure stops the job before any step, in one line that names the method
and the op (:class:`PreflightError`): the last aten op dispatched when it
failed (recorded by a dispatch mode; on a GPU, whose kernels run
asynchronously, an error a kernel raises may surface at a later op) and
the innermost line of osfl's sources. The bundle's ``plan.json`` keeps the
whole report under ``preflight``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import runpy
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from osfl.errors import OsflError

#: What the catalogue's commands import, third-party packages first (the
#: lent machine's image lacks some: ``osfl suite pack --wheels`` carries them).
IMPORTS = (
    "omegaconf",
    "safetensors",
    "numpy",
    "PIL",
    "scipy",
    "sklearn",
    "datasets",
    "flwr_datasets",
    "osfl.assembly",
    "osfl.experiment",
    "osfl.runner",
    "osfl.methods",
    "osfl.pretrain",
    "osfl.privacy",
    "osfl.report",
    "osfl.data.flwr_partitioners",
    "osfl.suite.mfu",
)
#: The preflight's own limit: no method is started after it.
BUDGET_S = 90.0
#: The methods the catalogue's steps run, proven first.
FIRST = (
    "fafi",
    "fedavg",
    "ensemble",
    "adi",
    "fedmitr",
    "fedpft",
    "fedcgs",
    "ghofl",
    "falcon",
    "fedhead",
    "fedlora",
    "eftvit",
)
#: The tiny task (before each method's ``smoke`` overrides).
TINY = (
    "data.image_size=8",
    "data.max_per_class=12",
    "partition.num_clients=2",
    "partition.alpha=0.5",
    "partition.min_partition_size=2",
    "train.batch_size=16",
    "cache_dir=null",
    "seeds=[0]",
    "progress=false",
)
#: After them: one local epoch on few images, bf16 autocast (on CUDA).
AFTER = ("train.epochs=1", "data.max_per_class=12", "train.amp=true")
#: A method's own additions: FAFI's SALT views (ColorJitter on the device).
EXTRA: dict[str, tuple[str, ...]] = {"fafi": ("method.fafi.augment=simclr",)}


class PreflightError(OsflError):
    """The preflight failed: the job stops before any step (exit status 2).
    ``details``: what failed (``method``, ``op``, ``where``, ``error``, or
    ``module``), for the bundle's ``plan.json``."""

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.details = {"error": message, **details}


def _where(tb: Any) -> str:
    """The innermost frame of osfl's sources in a traceback (``?``: none)."""
    for f in reversed(traceback.extract_tb(tb)):
        path = f.filename.replace("\\", "/")
        if "/osfl/" in path and "/tests/" not in path:
            return f"osfl/{path.rsplit('/osfl/', 1)[1]}:{f.lineno} in {f.name}"
    return "?"


def _op_tracker() -> Any:
    """A dispatch mode that remembers the last aten op it saw (``.op``)."""
    from torch.utils._python_dispatch import TorchDispatchMode  # heavy: torch

    class LastOp(TorchDispatchMode):
        op = "no op yet"

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            self.op = str(func)
            return func(*args, **(kwargs or {}))

    return LastOp()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The tiny task's health warnings (one epoch does not fit its data) are
    no news: osfl's log shows errors only meanwhile."""
    log = logging.getLogger("osfl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def check_imports(modules: Sequence[str] = IMPORTS, scripts: Sequence[str] = ()) -> list[str]:
    """Import ``modules`` and load each benchmark script of ``scripts`` as a
    module (its imports and definitions, not its ``main``); the first that
    fails is a :class:`PreflightError` naming it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:
            raise PreflightError(
                f"preflight: cannot import {name} ({type(e).__name__}: {e})", module=name
            ) from None
    for path in dict.fromkeys(scripts):
        if not Path(path).is_file():
            raise PreflightError(f"preflight: {path} does not exist (run from the repository root)")
        try:
            runpy.run_path(path, run_name="osfl_preflight")
        except Exception as e:
            raise PreflightError(
                f"preflight: cannot load {path} ({type(e).__name__}: {e})", module=path
            ) from None
    return [*modules, *dict.fromkeys(scripts)]


def method_order(names: Sequence[str]) -> list[str]:
    """``names`` with the catalogue's methods (:data:`FIRST`) first."""
    return [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]


def run_method(name: str, device: Any, splits: dict[str, Any]) -> None:
    """One tiny run of method ``name`` on ``device`` (clients, upload, server
    step, predictor, evaluation); ``splits`` caches the data per data config."""
    # heavy: the assembly, methods and runtime (torch)
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl import assembly  # heavy: torch
    from osfl.config import load_config  # heavy: omegaconf
    from osfl.fl.method import METHODS  # heavy: torch
    from osfl.fl.runtime.simulation import SimulationRuntime  # heavy: torch

    card = METHODS.get(name).card
    cfg = load_config(None, [*TINY, *card.smoke, *AFTER, *EXTRA.get(name, ()), f"methods=[{name}]"])
    key = repr(cfg.data)
    if key not in splits:
        splits[key] = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, splits[key], cfg.seeds[0])
    ctx = dataclasses.replace(ctx, run=dataclasses.replace(ctx.run, device=device))
    SimulationRuntime().execute(assembly.build_job(cfg, name, ctx))


def check_methods(
    device: Any,
    names: Sequence[str] | None = None,
    *,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    run: Callable[[str, Any, dict[str, Any]], None] = run_method,
) -> dict[str, Any]:
    """Run every method of ``names`` (default: every registered one) once on
    ``device`` (:func:`run_method`); the first failure is a
    :class:`PreflightError` naming the method and the op. Returns what ran,
    each method's seconds, and the methods not reached within ``budget_s``."""
    if names is None:
        import osfl.methods  # noqa: F401  # heavy: the methods (torch)
        from osfl.fl.method import METHODS  # heavy: torch

        names = METHODS.names()
    start = clock()
    done: list[dict[str, Any]] = []
    splits: dict[str, Any] = {}
    order = method_order(list(names))
    for i, name in enumerate(order):
        if clock() - start > budget_s:
            return {"methods": done, "not_reached": order[i:], "seconds": clock() - start}
        t0 = clock()
        tracker = _op_tracker()
        try:
            with _quiet(), tracker:
                run(name, device, splits)
        except Exception as e:
            where = _where(e.__traceback__)
            text = " ".join(f"{type(e).__name__}: {e}".split())[:400]
            raise PreflightError(
                f"preflight on {device}: method {name} failed at op {tracker.op} ({where}): {text}",
                method=name,
                op=tracker.op,
                where=where,
                done=[d["method"] for d in done],
            ) from None
        done.append({"method": name, "seconds": clock() - t0})
    return {"methods": done, "not_reached": [], "seconds": clock() - start}


def run_preflight(
    mode: str, scripts: Sequence[str], *, device: Any = None, names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The preflight of ``mode`` (``all`` or ``imports``): the imports, then,
    for ``all``, every method on ``device`` (default CUDA, which it needs)."""
    report: dict[str, Any] = {"imports": check_imports(scripts=scripts)}
    if mode == "all":
        if device is None:
            import torch  # heavy: torch

            if not torch.cuda.is_available():
                raise PreflightError(
                    "the preflight's method runs need a CUDA device; use --dry-run "
                    "or --preflight imports"
                )
            device = torch.device("cuda")
        report.update(check_methods(device, names), device=str(device))
    return report
