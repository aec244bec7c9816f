"""``threads_per_client: auto``: the torch threads per client, measured, not guessed.

Whether a client trains faster with one torch thread or with its share of the
CPUs depends on the model, the input size, the batch size and the machine (on
an idle 2-core machine 2 threads gave 1.6-1.8x the images/s of 1 for every
model; on a busy one the second thread mostly waits). So :func:`choose_threads`
times a few training steps (forward, cross-entropy, backward, SGD step on
random inputs of the run's shape and batch size) at 1 thread and at
``cpu_count // parallel_clients`` threads (at most torch's current count) and
keeps the faster; more threads must win by :data:`MIN_GAIN` or the fewer are
kept.

Results differ in their last bits with the thread count (torch splits CPU
reductions per thread), so the choice is recorded: logged with both rates,
kept in ``<cache_dir>/threads.json`` keyed by the machine (CPU count, CPU
kernel path, torch version), the model, the input shape, the batch size and
``parallel_clients`` — a later run on the same machine reads it instead of
measuring again, and so trains with the same count — and written into every
``metrics.json`` record (``threads_per_client``). A damaged cache file is a
warning and a fresh measurement, never a failure. Off the CPU nothing is
measured (the GPU does the work): the current count is kept.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from osfl import jsonio
from osfl.fl.runtime.rounds import torch_threads

__all__ = ["CACHE_FILE", "MIN_GAIN", "ThreadChoice", "choose_threads", "measure_images_per_s"]

log = logging.getLogger(__name__)

#: More threads are chosen only when they give at least this much more images/s.
MIN_GAIN = 1.10
#: The cache file under ``cache_dir``.
CACHE_FILE = "threads.json"
WARMUP_STEPS, TIMED_STEPS = 2, 4
#: Each timing runs at least this long (tiny models take milliseconds a step), and
#: the two candidates are timed in turn this many times, the median kept: one
#: noisy burst on a shared machine must not decide (a single 4-step timing once
#: put 1 thread at 2,786 and then at 4,217 images/s on the same idle machine).
MIN_SECONDS, ROUNDS = 0.2, 3


@dataclass(frozen=True)
class ThreadChoice:
    """The torch threads per client, and how they were chosen: ``source`` is
    ``measured``, ``cache``, ``only candidate`` (one CPU per client: nothing to
    choose) or ``device`` (not on the CPU: nothing measured);
    ``images_per_s``: candidate thread count -> training images per second."""

    threads: int
    source: str
    images_per_s: dict[int, float] = field(default_factory=dict)


#: Choices measured in this process without a cache directory (so that the
#: grid points of a sweep measure once): cache key -> choice.
_MEMO: dict[str, ThreadChoice] = {}


def measure_images_per_s(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch_size: int,
    threads: int,
    *,
    warmup: int = WARMUP_STEPS,
    steps: int = TIMED_STEPS,
) -> float:
    """Training images per second of ``model`` with ``threads`` torch threads:
    the median of the timed steps after ``warmup`` untimed ones (``steps`` at
    least, and as many more as fit in :data:`MIN_SECONDS`)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, *input_shape, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()
    times, labels = [], None
    with torch_threads(threads):
        i, start = 0, None
        while i < warmup + steps or time.perf_counter() - start < MIN_SECONDS:
            if i == warmup:
                start = time.perf_counter()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            if labels is None:
                labels = torch.randint(0, logits.shape[-1], (batch_size,), generator=gen)
            nn.functional.cross_entropy(logits, labels).backward()
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            i += 1
    return batch_size / max(statistics.median(times), 1e-9)


def _candidates(parallel_clients: int, max_threads: int | None) -> tuple[int, int]:
    if max_threads is None:
        share = (os.cpu_count() or 1) // max(1, parallel_clients)
        max_threads = min(share, torch.get_num_threads())
    return 1, max(1, max_threads)


def _cache_key(
    model_key: str, input_shape: tuple[int, ...], batch_size: int, parallel: int, hi: int
) -> str:
    key = {
        "cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "model": model_key,
        "input": list(input_shape),
        "batch_size": batch_size,
        "parallel_clients": parallel,
        "candidates": [1, hi],
    }
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def _read_cache(path: Path) -> dict[str, Any]:
    """The cached choices of ``path`` ({} when absent; a damaged file is a
    warning and {} — it is rewritten after the next measurement)."""
    if not path.is_file():
        return {}
    try:
        doc = jsonio.loads(path.read_text())
        choices = doc["choices"]
        if not isinstance(choices, dict):
            raise TypeError("'choices' is not an object")
        return choices
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("thread choice cache %s is damaged (%s); measuring again", path, e)
        return {}


def _cached(entry: Any, candidates: tuple[int, int]) -> ThreadChoice | None:
    try:
        threads = entry["threads"]
        rates = {int(k): float(v) for k, v in entry.get("images_per_s", {}).items()}
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads not in candidates:
        return None
    return ThreadChoice(threads, "cache", rates)


def _write_cache(path: Path, choices: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "choices": choices}, indent=1) + "\n")
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    except OSError as e:  # a read-only cache directory costs a re-measurement, nothing more
        log.warning("cannot write the thread choice cache %s (%s)", path, e)


def choose_threads(
    model: nn.Module | Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch_size: int,
    *,
    parallel_clients: int = 1,
    cache_dir: str | Path | None = None,
    device: torch.device | str = "cpu",
    model_key: str | None = None,
    max_threads: int | None = None,
) -> ThreadChoice:
    """The torch threads per client for training ``model`` (a module, or a
    builder called only when a measurement is needed) on batches of
    ``batch_size`` inputs of ``input_shape`` (C, H, W) with
    ``parallel_clients`` clients at a time: 1 or ``max_threads`` (default
    ``cpu_count // parallel_clients``, at most torch's current count),
    whichever trains faster (see the module docstring). ``model_key`` names the
    model in the cache (default: its class name and parameter count, which
    needs the model built). The global RNG and torch's thread count are left
    as they were."""
    input_shape = tuple(int(s) for s in input_shape)
    if torch.device(device).type != "cpu":
        return ThreadChoice(max(1, torch.get_num_threads() // max(1, parallel_clients)), "device")
    lo, hi = _candidates(parallel_clients, max_threads)
    if hi == lo:
        return ThreadChoice(lo, "only candidate")
    built: nn.Module | None = None
    if model_key is None:
        built = _build(model)
        n = sum(p.numel() for p in built.parameters())
        model_key = f"{type(built).__name__}/{n}"
    key = _cache_key(model_key, input_shape, batch_size, parallel_clients, hi)
    path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
    choices, hit = _lookup(key, path, (lo, hi))
    if hit is not None:
        log.info(
            "threads_per_client auto: %d (%s; from %s)",
            hit.threads,
            _rates(hit.images_per_s),
            path or "this process's earlier measurement",
        )
        return ThreadChoice(hit.threads, "cache", hit.images_per_s)

    net = built if built is not None else _build(model)
    choice = _measure(net, input_shape, batch_size, (lo, hi))
    _remember(key, choice, path, choices)
    return choice


def _lookup(
    key: str, path: Path | None, candidates: tuple[int, int]
) -> tuple[dict[str, Any], ThreadChoice | None]:
    """The cache file's entries (empty without a file) and the earlier choice
    for ``key``, if any: from the file, else from this process's memo. An entry
    that no longer fits the candidates is ignored, with a warning."""
    if path is None:
        return {}, _MEMO.get(key)
    choices = _read_cache(path)
    hit = _cached(choices[key], candidates) if key in choices else None
    if hit is None and key in choices:
        log.warning("thread choice cache %s: unusable entry; measuring again", path)
    return choices, hit


def _measure(
    net: nn.Module, input_shape: tuple[int, ...], batch_size: int, candidates: tuple[int, int]
) -> ThreadChoice:
    """Median images/s of each thread count, the two timed in turn (so that a
    slow spell of the machine hits both), drawing none of the run's random
    numbers; more threads win only when they are :data:`MIN_GAIN` faster."""
    lo, hi = candidates
    with torch.random.fork_rng(devices=[]):
        runs: dict[int, list[float]] = {lo: [], hi: []}
        for _ in range(ROUNDS):
            for t in (lo, hi):
                runs[t].append(measure_images_per_s(net, input_shape, batch_size, t))
        rates = {t: statistics.median(r) for t, r in runs.items()}
    threads = hi if rates[hi] >= MIN_GAIN * rates[lo] else lo
    return ThreadChoice(threads, "measured", rates)


def _remember(key: str, choice: ThreadChoice, path: Path | None, choices: dict[str, Any]) -> None:
    """Keep a measured choice for the next run: in the cache file with its rates
    and date, or, without a cache directory, in this process's memo."""
    if path is None:
        _MEMO[key] = choice
    log.info(
        "threads_per_client auto: %d (%s; measured%s)",
        choice.threads,
        _rates(choice.images_per_s),
        f", cached in {path}" if path is not None else "",
    )
    if path is not None:
        choices[key] = {
            "threads": choice.threads,
            "images_per_s": {str(t): round(r, 1) for t, r in choice.images_per_s.items()},
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        _write_cache(path, choices)


def _build(model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """A model to time: a copy of a given module (it is trained a few steps),
    or a built one; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return copy.deepcopy(model) if isinstance(model, nn.Module) else model()


def _rates(rates: dict[int, float]) -> str:
    return ", ".join(
        f"{t} thread{'s' if t > 1 else ''}: {r:.0f} images/s" for t, r in rates.items()
    )
