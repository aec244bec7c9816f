"""A real Flower federation on this machine: one ``flower-superlink`` and one
``flower-supernode`` per client, on loopback, launched with ``flwr run``.

This is what ``docs/flower.md`` tells a user to type, wrapped so that a test
or a demo can do it in one call and clean up after itself::

    with LocalFederation(num_nodes=3, workdir=tmp) as fed:
        out = fed.run(JobSpec(method="fedavg", out_dir=str(tmp / "run")))

Ports are picked free on 127.0.0.1; every process runs in ``workdir`` with
its log there (``superlink.log``, ``supernode-<i>.log``, ``flwr-run.log``);
``FLWR_HOME`` points at ``workdir/flwr-home`` so the user's own Flower config
is neither read nor written. TLS and node authentication are off
(``--insecure``): loopback only. :meth:`LocalFederation.stop` ends the
processes it started and their descendants (Flower's ``flower-superexec`` and
``flwr-serverapp`` / ``flwr-clientapp`` children), found through ``/proc``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import tomli_w

from osfl.errors import ConfigError, OsflError
from osfl.fl.runtime.flower_spec import JobSpec
from osfl.flower_app.app_dir import write_app

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
CONNECTION = "osfl-local"


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    """Block until something accepts connections on ``port`` (or fail with its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OsflError(
                f"process exited with {proc.returncode}; see {log_file}:\n{_tail(log_file)}"
            )
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise OsflError(f"nothing listens on {HOST}:{port} after {timeout:.0f} s; see {log_file}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, children first."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():  # a zombie is dead for our purposes
        with contextlib.suppress(OSError, IndexError):
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _bin(name: str) -> str:
    """A Flower console script next to this Python (or on PATH)."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise ConfigError(
            f"{name} not found: install Flower (pip install flwr) in this environment"
        )
    return found


class LocalFederation:
    """A SuperLink and ``num_nodes`` SuperNodes (``partition-id`` 0..n-1) on
    loopback; :meth:`run` submits one osfl job with ``flwr run``."""

    def __init__(
        self,
        num_nodes: int,
        workdir: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
    ):
        if num_nodes < 1:
            raise ConfigError(f"num_nodes must be >= 1, got {num_nodes}")
        self.num_nodes = num_nodes
        self.workdir = Path(workdir).resolve()
        self.start_timeout = start_timeout
        self.env = {**os.environ, **dict(env or {})}
        self.flwr_home = self.workdir / "flwr-home"
        self.env["FLWR_HOME"] = str(self.flwr_home)
        self.superlink_port = 0
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[object] = []

    # --- lifecycle --------------------------------------------------------
    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        f = (self.workdir / log_name).open("wb")
        self._logs.append(f)
        proc = subprocess.Popen(
            args,
            cwd=self.workdir,
            env=self.env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def start(self) -> LocalFederation:
        """Start the SuperLink, wait for it, then the SuperNodes."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.superlink_port = free_port()
        address = f"{HOST}:{self.superlink_port}"
        (self.flwr_home / "config.toml").write_text(
            tomli_w.dumps(
                {
                    "superlink": {
                        "default": CONNECTION,
                        CONNECTION: {"address": address, "insecure": True},
                    }
                }
            )
        )
        link = self._spawn(
            [
                _bin("flower-superlink"),
                "--insecure",
                "--host",
                HOST,
                "--port",
                str(self.superlink_port),
                "--disable-runtime-dependency-installation",
            ],
            "superlink.log",
        )
        wait_for_port(self.superlink_port, self.start_timeout, link, self.workdir / "superlink.log")
        for i in range(self.num_nodes):
            port = free_port()
            node = self._spawn(
                [
                    _bin("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    address,
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--node-config",
                    f"partition-id={i} num-partitions={self.num_nodes}",
                ],
                f"supernode-{i}.log",
            )
            wait_for_port(port, self.start_timeout, node, self.workdir / f"supernode-{i}.log")
        log.info("local Flower federation: SuperLink %s, %d SuperNodes", address, self.num_nodes)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every process started here and every descendant, SIGKILL
        what is still alive after ``grace`` seconds."""
        tree: list[int] = []
        for p in self.procs:
            tree += [p.pid, *descendants(p.pid)]
        for pid in tree:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in tree:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=2)
        deadline = time.monotonic() + 5.0  # SIGKILL is asynchronous: wait for the exits
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in tree if _alive(pid)]
        if left:
            log.warning("processes still alive after stop(): %s", left)
        for f in self._logs:
            f.close()  # type: ignore[attr-defined]
        self.procs.clear()
        self._logs.clear()

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- running a job ----------------------------------------------------
    def run(self, spec: JobSpec, timeout: float = 600.0) -> Path:
        """Submit ``spec`` with ``flwr run --stream`` and wait for the run to
        end; returns the run directory the ServerApp wrote (``spec.out_dir``,
        required here so that it can be found)."""
        if not spec.out_dir:
            raise ConfigError("LocalFederation.run needs spec.out_dir (where the server writes)")
        app = write_app(self.workdir / "app", spec)
        overrides = self.workdir / "run-config.toml"
        overrides.write_text(tomli_w.dumps(spec.to_run_config()))
        cmd = [
            _bin("flwr"),
            "run",
            str(app),
            CONNECTION,
            "--run-config",
            str(overrides),
            "--stream",
        ]
        log_file = self.workdir / "flwr-run.log"
        with log_file.open("wb") as f:
            try:
                subprocess.run(
                    cmd,
                    cwd=self.workdir,
                    env=self.env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise OsflError(
                    f"flwr run did not finish in {timeout:.0f} s; see {log_file}"
                ) from e
        out = Path(spec.out_dir)
        if not (out / "metrics.json").is_file():
            raise OsflError(
                f"the Flower run wrote no {out / 'metrics.json'}; flwr run said:\n{_tail(log_file)}"
            )
        return out
