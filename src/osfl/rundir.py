"""A run directory: where one ``osfl run`` leaves everything it produced.

Layout (see ``docs/run-directory.md``)::

    runs/<YYYYmmdd-HHMMSS>-<name>/
      config.yaml       the resolved configuration (re-runnable with ``osfl run``)
      metrics.json      one record per grid point × method × seed
      events.jsonl      one JSON object per phase / round event
      summary.md        the mean ± std table
      partition*.png    the clients' class-count heat map(s)
      curves.png        accuracy per round (multi-round methods with eval_every)
      run.log           the log of the run (level INFO and above)
      models/<slug>/    each job's final server model: state.safetensors,
                        model.safetensors, card.json (``osfl eval`` scores it again)
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from osfl import jsonio
from osfl.errors import ConfigError, OsflError
from osfl.fl.observers import Observer
from osfl.interrupts import atomic_section, on_exit_at_once
from osfl.safe_read import read_json

log = logging.getLogger(__name__)

#: What an osfl run writes; a directory holding one of them is a run directory.
RUN_FILES = ("config.yaml", "metrics.json", "events.jsonl", "summary.md", "run.log")
#: How a run treats its directory: a fresh one, replace an old run, or finish one.
MODES = ("new", "overwrite", "resume")


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in RUN_FILES)


def prepare(path: Path, mode: str) -> None:
    """Make ``path`` ready for a run in ``mode``; results are never overwritten
    or mixed silently.

    ``new``: the directory must not exist or be empty. ``overwrite``: an old
    run directory there is deleted first (anything else non-empty is refused:
    osfl deletes only what looks like its own). ``resume``: it must hold a run
    (the caller finishes its missing records).
    """
    if mode not in MODES:
        raise ConfigError(f"run directory mode must be one of {', '.join(MODES)}, got {mode!r}")
    exists = path.exists()
    if exists and not path.is_dir():
        raise ConfigError(f"run directory {path} exists and is not a directory")
    busy = exists and any(path.iterdir())
    if mode == "new" and busy and not is_run_dir(path):
        raise ConfigError(
            f"{path} is not empty and is not an osfl run directory: give --out a new or "
            "empty directory"
        )
    if mode == "new" and busy:
        raise ConfigError(
            f"run directory {path} already holds an osfl run: pass --resume {path} to finish "
            "an interrupted run, --overwrite to replace it, or another --out"
        )
    if mode == "overwrite" and busy:
        if not is_run_dir(path):
            raise ConfigError(
                f"{path} is not empty and is not an osfl run directory (no {RUN_FILES[0]}, "
                f"{RUN_FILES[1]}, ...): refusing to delete it; give another --out"
            )
        log.warning("replacing the run in %s (--overwrite)", path)
        shutil.rmtree(path)
    if mode == "resume":
        why = resume_problem(path)
        if why is not None:
            raise ConfigError(why)


def resume_problem(path: Path) -> str | None:
    """Why ``osfl run --resume PATH`` cannot finish a run there, in one line
    that names what is missing and what to pass (``None``: it can). A run
    directory's ``config.yaml`` is written before anything else, so a folder
    without one holds no run to finish."""
    pass_this = "pass the folder `osfl run` printed as `run directory: ...`"
    if not path.exists():
        return f"--resume {path}: there is no such directory; {pass_this}"
    if not path.is_dir():
        return f"--resume {path}: this is a file, not a run directory; {pass_this}"
    if (path / "config.yaml").is_file():
        return None
    if (path / "config.yaml").exists() or (path / "config.yaml").is_symlink():
        return f"--resume {path}: its config.yaml is not a regular file; {pass_this}"
    runs = sorted(p.parent.name for p in path.glob("*/config.yaml") if is_run_dir(p.parent))
    if runs:
        shown = ", ".join(str(path / r) for r in runs[-3:])
        return (
            f"--resume {path}: this folder holds run directories, not a run; pass one of "
            f"them (e.g. {shown})"
        )
    if is_run_dir(path):
        return (
            f"--resume {path}: the run's config.yaml is missing (every run writes it first), "
            "so there is no config to finish it with; start a new run"
        )
    return (
        f"--resume {path}: not an osfl run directory (no config.yaml, which every run "
        f"writes first); {pass_this}"
    )


class RunDir:
    """Creates the directory (see :func:`prepare` for ``mode``), owns
    ``run.log`` and ``events.jsonl``.

    Use as a context manager: the log handler is detached at the end, and a run
    that stops on an exception says why in ``events.jsonl`` (``run_failed``)
    and ``run.log`` before the exception goes on.
    """

    def __init__(self, path: str | Path, *, mode: str = "new"):
        self.path = Path(path)
        prepare(self.path, mode)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create run directory {self.path}: {e}") from e
        self._events = (self.path / "events.jsonl").open("a", encoding="utf-8")
        self._handler = logging.FileHandler(self.path / "run.log", encoding="utf-8")
        self._handler.setLevel(logging.INFO)
        self._handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        self._logger = logging.getLogger("osfl")
        self._old_level = self._logger.level
        self._logger.addHandler(self._handler)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._t0 = time.perf_counter()
        # a second Ctrl-C ends the process without __exit__: say why here first
        self._forget_exit = on_exit_at_once(self._stopped_at_once)

    def _stopped_at_once(self) -> None:
        self.event("run_failed", error="KeyboardInterrupt", reason="interrupted twice")
        log.error("run stopped at once: interrupted twice (%s)", self._kept())

    @staticmethod
    def default_path(name: str, root: str | Path = "runs") -> Path:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "run"
        path = Path(root) / f"{stamp}-{safe}"
        n = 1
        while path.exists():  # two runs in the same second
            n += 1
            path = Path(root) / f"{stamp}-{safe}-{n}"
        return path

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event line: ``{"event", "t" (s since start), ...fields}``."""
        line = {"event": kind, "t": round(time.perf_counter() - self._t0, 4), **fields}
        with atomic_section():  # Ctrl-C never cuts a line
            self._events.write(jsonio.dumps(line) + "\n")
            self._events.flush()

    def write_text(self, name: str, text: str) -> Path:
        p = self.path / name
        with atomic_section():  # Ctrl-C never leaves half a config.yaml or summary.md
            p.write_text(text, encoding="utf-8")
        return p

    def close(self) -> None:
        self._forget_exit()
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._old_level)
        self._handler.close()
        self._events.close()

    def _kept(self) -> str:
        """What a stopped run leaves: how many finished records metrics.json holds."""
        try:  # bounded, a regular file only (a FIFO must not hang a failing run)
            doc = read_json(self.path / "metrics.json", max_bytes=256 << 20, what="metrics file")
            n = len(doc["records"])
        except (OsflError, KeyError, TypeError):
            n = 0
        if n == 0:
            return "no record finished: metrics.json holds none"
        return f"{n} finished record(s) are in metrics.json"

    def __enter__(self) -> RunDir:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            why = str(exc).splitlines()[0] if str(exc) else kind.__name__ if kind else "?"
            reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else why
            self.event("run_failed", error=type(exc).__name__, reason=reason)
            log.error("run stopped: %s: %s (%s)", type(exc).__name__, reason, self._kept())
        self.close()


class EventObserver(Observer):
    """Writes a ``round`` event per round (bytes, clients, refusals, times, metrics)."""

    def __init__(self, rundir: RunDir, context: Mapping[str, Any]):
        self.rundir = rundir
        self.context = dict(context)

    def on_round_end(self, round: int, state: Any, metrics: Mapping[str, Any]) -> None:
        self.rundir.event("round", **self.context, **dict(metrics))
