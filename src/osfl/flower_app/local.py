"""A real Flower federation on this machine: one ``flower-superlink`` and one
``flower-supernode`` per client, on loopback, launched with ``flwr run``.

This is what ``docs/flower.md`` tells a user to type, wrapped so that a test
or a demo can do it in one call and clean up after itself::

    with LocalFederation(num_nodes=3, workdir=tmp) as fed:
        out = fed.run(JobSpec(method="fedavg", out_dir=str(tmp / "run")))

Ports are picked free on 127.0.0.1; every process runs in ``workdir`` with
its log there (``superlink.log``, ``supernode-<i>.log``, ``flwr-run.log``);
``FLWR_HOME`` points at ``workdir/flwr-home`` so the user's own Flower config
is neither read nor written. :meth:`LocalFederation.stop` ends the
processes it started and their descendants (Flower's ``flower-superexec`` and
``flwr-serverapp`` / ``flwr-clientapp`` children), found through ``/proc``.

By default TLS and node authentication are off (``--insecure``: loopback
only). ``tls=True`` makes a throwaway CA and server certificate in
``workdir/tls`` (:mod:`osfl.flower_app.certs`) and starts the SuperLink with
``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``, every SuperNode with
``--root-certificates`` and the ``flwr`` connection with ``root-certificates``.
``node_auth=True`` (needs TLS, as Flower does) also starts the SuperLink with
``--enable-supernode-auth``, makes one key pair per node in
``workdir/node-keys``, registers each public key with ``flwr supernode
register`` and starts each node with ``--auth-supernode-private-key``: Flower
1.41's mechanism (``flwr/superlink/cli/flower_superlink.py``,
``flwr/cli/supernode/register.py``, ``flwr/supernode/cli/flower_supernode.py``).
See ``docs/flower-security.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from osfl.errors import ConfigError, OsflError
from osfl.flower.spec import JobSpec
from osfl.flower_app.app_dir import write_app
from osfl.flower_app.certs import CertPaths, NodeKeyPaths, make_certificates, make_node_keys
from osfl.flower_app.node_config import RESERVED_NODE_KEYS, NodeConfigValue, node_config_string
from osfl.flower_app.processes import (
    HOST,
    alive,
    descendants,
    flower_bin,
    free_port,
    json_tail,
    log_tail,
    plain,
    send_signal,
    wait_for_port,
)

log = logging.getLogger(__name__)

#: Re-exported: tests and :mod:`osfl.flower_app.runs` import them from here.
__all__ = [
    "CONNECTION",
    "HOST",
    "RESERVED_NODE_KEYS",
    "LocalFederation",
    "NodeConfigValue",
    "descendants",
    "flower_bin",
    "free_port",
    "json_tail",
    "node_config_string",
    "plain",
    "wait_for_port",
]

CONNECTION = "osfl-local"


class LocalFederation:
    """A SuperLink and ``num_nodes`` SuperNodes (``partition-id`` 0..n-1) on
    loopback; :meth:`run` submits one osfl job with ``flwr run``. Each node
    trains with ``threads_per_node`` torch threads (``OMP_NUM_THREADS``; an
    explicit ``env`` entry wins).

    ``tls`` / ``node_auth`` turn on Flower's TLS and SuperNode authentication
    (see the module docstring); ``node_configs[i]`` adds node-config entries to
    node ``i`` after ``partition-id`` and ``num-partitions`` (e.g. ``{"data":
    "imagefolder:/srv/site3"}``)."""

    def __init__(
        self,
        num_nodes: int,
        workdir: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        threads_per_node: int = 1,
        tls: bool = False,
        node_auth: bool = False,
        node_configs: Sequence[Mapping[str, NodeConfigValue]] | None = None,
    ):
        if num_nodes < 1:
            raise ConfigError(f"num_nodes must be >= 1, got {num_nodes}")
        if threads_per_node < 1:
            raise ConfigError(f"threads_per_node must be >= 1, got {threads_per_node}")
        if node_auth and not tls:
            raise ConfigError(
                "node_auth=True needs tls=True: Flower refuses SuperNode authentication "
                "without TLS (flower-superlink --enable-supernode-auth with --insecure)"
            )
        self.num_nodes = num_nodes
        self.workdir = Path(workdir).resolve()
        self.start_timeout = start_timeout
        self.tls = tls
        self.node_auth = node_auth
        self.node_config_strings = self._node_config_strings(node_configs)
        # Every node is a process of its own on this machine: unpinned, each one's
        # OpenMP pool takes every core and they fight (~100x slower on 2 cores),
        # and the simulation's numbers need the same threads per client.
        threads = str(threads_per_node)
        pinned = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        self.env = {**os.environ, **pinned, **dict(env or {})}
        self.flwr_home = self.workdir / "flwr-home"
        self.env["FLWR_HOME"] = str(self.flwr_home)
        self.superlink_port = 0
        self.certs: CertPaths | None = None
        self.node_keys: list[NodeKeyPaths] = []
        self.registered_node_ids: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.nodes: list[subprocess.Popen[bytes]] = []
        self._logs: list[object] = []

    def _node_config_strings(
        self, node_configs: Sequence[Mapping[str, NodeConfigValue]] | None
    ) -> list[str]:
        """Each node's ``--node-config``; checked here, before anything starts."""
        if node_configs is None:
            node_configs = [{}] * self.num_nodes
        if isinstance(node_configs, Mapping) or len(node_configs) != self.num_nodes:
            raise ConfigError(
                f"node_configs must be a list of {self.num_nodes} mappings (one per node)"
            )
        out = []
        for i, extra in enumerate(node_configs):
            taken = [k for k in RESERVED_NODE_KEYS if k in extra]
            if taken:
                raise ConfigError(
                    f"node_configs[{i}] sets {', '.join(taken)}: LocalFederation sets "
                    "these itself (node i plays client i)"
                )
            own = {"partition-id": i, "num-partitions": self.num_nodes}
            out.append(node_config_string({**own, **extra}))
        return out

    @property
    def superlink_address(self) -> str:
        """``host:port`` of the SuperLink (its Fleet, Control and Runtime APIs)."""
        return f"{HOST}:{self.superlink_port}"

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

    def _connection(self) -> dict[str, Any]:
        """The ``flwr`` CLI's connection to this SuperLink (``config.toml``):
        ``root-certificates`` (an absolute path, which flwr requires) with
        TLS, else ``insecure = true``
        (``flwr/cli/flower_config.py::parse_superlink_connection``)."""
        if self.certs is not None:
            return {"address": self.superlink_address, "root-certificates": str(self.certs.ca_cert)}
        return {"address": self.superlink_address, "insecure": True}

    def _superlink_args(self) -> list[str]:
        args = [flower_bin("flower-superlink")]
        args += self.certs.superlink_flags() if self.certs is not None else ["--insecure"]
        if self.node_auth:
            args.append("--enable-supernode-auth")
        return [
            *args,
            "--host",
            HOST,
            "--port",
            str(self.superlink_port),
            "--disable-runtime-dependency-installation",
        ]

    def _supernode_args(
        self,
        node_config: str,
        *,
        insecure: bool,
        private_key: str | Path | None,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], int]:
        port = free_port()
        args = [flower_bin("flower-supernode")]
        if insecure or self.certs is None:
            args.append("--insecure")
        else:
            args += self.certs.supernode_flags()
        if private_key is not None:
            args += ["--auth-supernode-private-key", str(private_key)]
        args += ["--superlink", self.superlink_address, "--host", HOST, "--port", str(port)]
        if node_config:
            args += ["--node-config", node_config]
        return [*args, *extra_args], port

    def start(self) -> LocalFederation:
        """Start the SuperLink, wait for it, register the node keys (with
        ``node_auth``), then start the SuperNodes."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        if self.tls:  # LocalFederation's own throwaway files: a rerun replaces them
            self.certs = make_certificates(self.workdir / "tls", overwrite=True)
        if self.node_auth:
            self.node_keys = [
                make_node_keys(self.workdir / "node-keys", f"supernode-{i}", overwrite=True)
                for i in range(self.num_nodes)
            ]
        self.superlink_port = free_port()
        (self.flwr_home / "config.toml").write_text(
            tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: self._connection()}})
        )
        link = self._spawn(self._superlink_args(), "superlink.log")
        wait_for_port(self.superlink_port, self.start_timeout, link, self.workdir / "superlink.log")
        self.registered_node_ids = [self.register_node(k.public_key) for k in self.node_keys]
        for i in range(self.num_nodes):
            args, port = self._supernode_args(
                self.node_config_strings[i],
                insecure=False,
                private_key=self.node_keys[i].private_key if self.node_auth else None,
            )
            node = self._spawn(args, f"supernode-{i}.log")
            self.nodes.append(node)
            wait_for_port(port, self.start_timeout, node, self.workdir / f"supernode-{i}.log")
        log.info(
            "local Flower federation: SuperLink %s%s%s, %d SuperNodes",
            self.superlink_address,
            " (TLS)" if self.tls else "",
            " (node authentication)" if self.node_auth else "",
            self.num_nodes,
        )
        return self

    def spawn_node(
        self,
        name: str,
        *,
        node_config: Mapping[str, NodeConfigValue] | None = None,
        insecure: bool = False,
        private_key: str | Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """Start one more SuperNode, outside the ``num_nodes`` of the
        federation (a late joiner, or one the SuperLink must refuse), logging
        to ``supernode-<name>.log``. It uses TLS like the others unless
        ``insecure``, authenticates with ``private_key`` if given (its public
        key is *not* registered: call :meth:`register_node` first for that),
        and gets ``extra_args`` (e.g. ``["--max-retries", "2"]``).
        :meth:`stop` ends it; nothing waits for it to come up."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.isdigit():
            raise ConfigError(
                f"node name {name!r} must be a plain file name part, not a number "
                "(supernode-<i>.log belongs to node i)"
            )
        if not self.superlink_port:
            raise ConfigError("spawn_node needs a started federation (start() or `with`)")
        args, _ = self._supernode_args(
            node_config_string(node_config or {}),
            insecure=insecure,
            private_key=private_key,
            extra_args=extra_args,
        )
        return self._spawn(args, f"supernode-{name}.log")

    def _flwr(self, *args: str, timeout: float) -> str:
        """Run the ``flwr`` CLI against this SuperLink; its stdout, or an
        error with its output."""
        try:
            done = subprocess.run(
                [flower_bin("flwr"), *args],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise OsflError(f"flwr {' '.join(args)} did not finish in {timeout:.0f} s") from e
        if done.returncode != 0:
            raise OsflError(
                f"flwr {' '.join(args)} failed ({done.returncode}):\n"
                + (done.stdout + done.stderr).decode(errors="replace")[-3000:]
            )
        return done.stdout.decode(errors="replace")

    def register_node(self, public_key: str | Path) -> int:
        """Register a SuperNode's public key with the SuperLink (``flwr
        supernode register KEY CONNECTION``); returns the node id it gets."""
        out = self._flwr(
            "supernode",
            "register",
            str(public_key),
            CONNECTION,
            "--format",
            "json",
            timeout=self.start_timeout,
        )
        return int(json_tail(out)["node-id"])

    def supernodes(self) -> list[dict[str, Any]]:
        """The SuperLink's node table (``flwr supernode ls --format json``):
        one dict per node with ``node-id``, ``status`` (``registered``,
        ``online``, ``offline``, ...) and timestamps."""
        out = self._flwr("supernode", "ls", CONNECTION, "--format", "json", timeout=60)
        return list(json_tail(out).get("nodes", []))

    def online_node_ids(self) -> list[int]:
        """Ids of the nodes the SuperLink sees online now."""
        return sorted(int(n["node-id"]) for n in self.supernodes() if n["status"] == "online")

    def wait_online(self, count: int, timeout: float = 60.0) -> list[int]:
        """Block until ``count`` nodes are online; returns their ids."""
        deadline = time.monotonic() + timeout
        while True:
            online = self.online_node_ids()
            if len(online) >= count:
                return online
            if time.monotonic() > deadline:
                raise OsflError(
                    f"{len(online)} of {count} SuperNodes online after {timeout:.0f} s; "
                    f"see the supernode-*.log files in {self.workdir}"
                )
            time.sleep(1.0)

    def node_pids(self, i: int) -> list[int]:
        """Process ids of SuperNode ``i`` and its descendants (its
        ``flower-superexec`` and any running ``flwr-clientapp``)."""
        if not 0 <= i < len(self.nodes):
            raise ConfigError(f"no SuperNode {i}: this federation has {len(self.nodes)}")
        pid = self.nodes[i].pid
        return [pid, *descendants(pid)] if alive(pid) else []

    def kill_node(self, i: int, timeout: float = 10.0) -> None:
        """SIGKILL SuperNode ``i`` and its descendants (a site that drops out
        mid-run, with no goodbye to the SuperLink) and wait until they are gone."""
        tree = self.node_pids(i)
        for pid in tree:
            send_signal(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.nodes[i].wait(timeout=timeout)
        _wait_gone(tree, time.monotonic() + timeout)
        left = [pid for pid in tree if alive(pid)]
        if left:
            raise OsflError(f"SuperNode {i}: processes {left} still alive after SIGKILL")

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every process started here and every descendant, SIGKILL
        what is still alive after ``grace`` seconds."""
        tree = _live_tree(self.procs)
        for pid in tree:
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        _wait_gone(tree, deadline)
        for pid in tree:
            if alive(pid):
                send_signal(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=2)
        _wait_gone(tree, time.monotonic() + 5.0)  # SIGKILL is asynchronous: wait for the exits
        left = [pid for pid in tree if alive(pid)]
        if left:
            log.warning("processes still alive after stop(): %s", left)
        for f in self._logs:
            f.close()  # type: ignore[attr-defined]
        self.procs.clear()
        self.nodes.clear()
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
    def run_args(self, spec: JobSpec) -> list[str]:
        """``APP SUPERLINK --run-config FILE`` for ``flwr run`` (or ``osfl
        flower run``): the app directory and the spec's run config, written
        under this federation's work directory."""
        app = write_app(self.workdir / "app", spec)
        overrides = self.workdir / "run-config.toml"
        overrides.write_text(tomli_w.dumps(spec.to_run_config()))
        return [str(app), CONNECTION, "--run-config", str(overrides)]

    def run(self, spec: JobSpec, timeout: float = 600.0) -> Path:
        """Submit ``spec`` with ``flwr run --stream`` and wait for the run to
        end; returns the run directory the ServerApp wrote (``spec.out_dir``,
        required here so that it can be found)."""
        if not spec.out_dir:
            raise ConfigError("LocalFederation.run needs spec.out_dir (where the server writes)")
        cmd = [flower_bin("flwr"), "run", *self.run_args(spec), "--stream"]
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
                f"the Flower run wrote no {out / 'metrics.json'}; flwr run said:\n{log_tail(log_file)}"
            )
        return out


def _live_tree(procs: Sequence[subprocess.Popen]) -> list[int]:
    """The pids of the processes still running and of their descendants; a
    reaped pid (a killed or refused node) is left out, since it may be reused."""
    tree: list[int] = []
    for p in procs:
        if p.poll() is None:
            tree += [p.pid, *descendants(p.pid)]
    return tree


def _wait_gone(pids: Sequence[int], deadline: float) -> None:
    """Poll until none of ``pids`` is alive or ``deadline`` (monotonic) passes."""
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
