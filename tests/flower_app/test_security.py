"""TLS and SuperNode authentication for osfl's Flower deployments.

Fast: the rehearsal certificates (:mod:`osfl.flower_app.certs`: signed by the
CA, valid for the hosts in a real TLS handshake, key permissions, refusal to
overwrite), SuperNode keys read by Flower's own loaders, the flags parsed by
Flower's own argument parsers, the ``--node-config`` string read back by
Flower's parser. Slow (``pytest -m slow tests/flower_app/test_security.py``): real
``flower-superlink`` / ``flower-supernode`` processes on loopback — a TLS
SuperLink refuses an insecure node and runs an osfl job with TLS nodes; with
node authentication a registered node runs and an unknown key is refused.
"""

from __future__ import annotations

import json
import socket
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from osfl.errors import ConfigError
from osfl.flower_app import certs
from osfl.flower_app.certs import make_certificates, make_node_keys
from osfl.flower_app.local import LocalFederation, descendants, node_config_string
from support.tiny import TINY_FLOWER_SECURITY


# --------------------------------------------------------------------------- certificates
def _load(paths: certs.CertPaths) -> tuple[x509.Certificate, x509.Certificate]:
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    return ca, server


def test_server_certificate_is_signed_by_the_ca_and_names_the_hosts(tmp_path: Path) -> None:
    hosts = ("127.0.0.1", "localhost", "link.example.org", "::1")
    paths = make_certificates(tmp_path / "tls", hosts=hosts, days=7)
    assert paths == certs.CertPaths(
        tmp_path / "tls" / "ca.crt",
        tmp_path / "tls" / "server.pem",
        tmp_path / "tls" / "server.key",
    )
    ca, server = _load(paths)
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "link.example.org"]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    days = (server.not_valid_after_utc - server.not_valid_before_utc).total_seconds() / 86400
    assert 7 < days < 7.01  # 7 days plus the clock-skew margin
    key = serialization.load_pem_private_key(paths.server_key.read_bytes(), password=None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    assert not (tmp_path / "tls" / "ca.key").exists()  # the CA key is never written


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[certs.CertPaths, int]]:
    """A TLS server on loopback with the rehearsal certificate (handshakes only)."""
    paths = make_certificates(tmp_path / "tls")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(paths.server_cert, paths.server_key)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield paths, sock.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


def _handshake(ca: Path, port: int, server_hostname: str) -> dict:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # what Python 3.13's default context does
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        assert tls.recv(2) == b"ok"
        return tls.getpeercert()


def test_a_client_trusting_the_ca_completes_a_strict_handshake_for_each_host(
    tls_server: tuple[certs.CertPaths, int], tmp_path: Path
) -> None:
    paths, port = tls_server
    for host in ("127.0.0.1", "localhost"):
        peer = _handshake(paths.ca_cert, port, host)
        assert ("IP Address", "127.0.0.1") in peer["subjectAltName"]
    with pytest.raises(ssl.SSLCertVerificationError, match=r"[Hh]ostname mismatch"):
        _handshake(paths.ca_cert, port, "elsewhere.example.org")
    other = make_certificates(tmp_path / "other-ca")  # a client trusting another CA
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(other.ca_cert, port, "localhost")


def test_keys_are_private_and_certificates_readable(tmp_path: Path) -> None:
    paths = make_certificates(tmp_path / "tls")
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.joinpath("tls").iterdir()}
    assert mode == {"ca.crt": 0o644, "server.pem": 0o644, "server.key": 0o600}
    node = make_node_keys(tmp_path / "keys", "site-3")
    assert stat.S_IMODE(node.private_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(node.public_key.stat().st_mode) == 0o644
    assert paths.server_key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


def test_existing_files_are_never_overwritten_unless_asked(tmp_path: Path) -> None:
    first = make_certificates(tmp_path)
    before = {p: p.read_bytes() for p in (first.ca_cert, first.server_cert, first.server_key)}
    with pytest.raises(ConfigError, match=r"refusing to overwrite .*ca\.crt.*overwrite=True"):
        make_certificates(tmp_path)
    assert {p: p.read_bytes() for p in before} == before
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "server.key").write_text("mine")  # one clashing file is enough
    with pytest.raises(ConfigError, match=r"server\.key"):
        make_certificates(tmp_path / "a")
    assert not (tmp_path / "a" / "ca.crt").exists()  # refused before writing anything
    again = make_certificates(tmp_path, overwrite=True)
    assert again.ca_cert.read_bytes() != before[first.ca_cert]
    _load(again)[1].verify_directly_issued_by(_load(again)[0])
    assert stat.S_IMODE(again.server_key.stat().st_mode) == 0o600
    make_node_keys(tmp_path, "n0")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        make_node_keys(tmp_path, "n0")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hosts": ()}, "non-empty list"),
        ({"hosts": "localhost"}, "non-empty list"),
        ({"hosts": ("bad host",)}, "neither an IP address nor a valid DNS name"),
        ({"hosts": ("-x.org",)}, "neither an IP address"),
        ({"days": 0}, "positive integer"),
        ({"days": 1.5}, "positive integer"),
    ],
)
def test_bad_certificate_requests_are_refused(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_certificates(tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())


def test_certificates_into_a_file_path_are_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        make_certificates(tmp_path / "f")
    with pytest.raises(ConfigError, match="plain file name"):
        make_node_keys(tmp_path, "../escape")


def test_flower_reads_the_node_keys_and_parses_the_flags(tmp_path: Path) -> None:
    """Flower 1.41's own loaders and argument parsers accept what osfl makes."""
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.common.args import try_obtain_root_certificates, try_obtain_server_certificates
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import (
        _parse_args_run_supernode,
        _try_setup_client_authentication,
    )

    paths = make_certificates(tmp_path / "tls")
    node = make_node_keys(tmp_path / "keys", "supernode-0")

    link = _parse_args_run_superlink().parse_args(
        [*paths.superlink_flags(), "--enable-supernode-auth"]
    )
    assert link.enable_supernode_auth and not link.insecure
    ca, cert, key = try_obtain_server_certificates(link)
    assert (ca, cert, key) == tuple(
        p.read_bytes() for p in (paths.ca_cert, paths.server_cert, paths.server_key)
    )

    args = _parse_args_run_supernode().parse_args(
        [*paths.supernode_flags(), "--auth-supernode-private-key", str(node.private_key)]
    )
    assert try_obtain_root_certificates(args, "127.0.0.1:9092") == paths.ca_cert.read_bytes()
    private, public = _try_setup_client_authentication(args)
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    registered = try_load_public_key(node.public_key)  # what `flwr supernode register` sends
    assert registered == public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_certs_command_writes_files_and_prints_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    out = tmp_path / "c"
    assert certs.main([str(out), "--host", "10.0.0.5", "--host", "link", "--node-keys", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"--ssl-ca-certfile {out / 'ca.crt'}" in printed
    assert f"--ssl-keyfile {out / 'server.key'}" in printed
    assert "--enable-supernode-auth" in printed
    assert f"--root-certificates {out / 'ca.crt'}" in printed
    assert f"flwr supernode register {out / 'supernode-1.pub'}" in printed
    assert f"--auth-supernode-private-key {out / 'supernode-0'}" in printed
    san = _load(certs.CertPaths(out / "ca.crt", out / "server.pem", out / "server.key"))[1]
    names = san.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # the loopback names are always added: the SuperLink's own SuperExec connects there
    assert names.get_values_for_type(x509.DNSName) == ["link", "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [
        "10.0.0.5",
        "127.0.0.1",
    ]
    assert "flower-supernode --superlink 10.0.0.5:9093 --root-certificates" in printed
    # as printed, the commands run offline on one machine: no dependency installation,
    # a port per SuperNode, a flwr home of their own, a connection the run uses
    link = next(line for line in printed.splitlines() if line.startswith("flower-superlink "))
    assert "--disable-runtime-dependency-installation --port 9093 &" in link
    nodes = [line for line in printed.splitlines() if line.startswith("flower-supernode ")]
    assert [n.split("--port ")[1].split()[0] for n in nodes] == ["9100", "9101"]
    assert f"export FLWR_HOME={out / 'flwr-home'}" in printed
    assert printed.rstrip().endswith("flwr run ./osfl-app osfl-tls --stream")
    # existing files: a clear error and exit status 2, nothing replaced
    key = (out / "server.key").read_bytes()
    assert certs.main([str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (out / "server.key").read_bytes() == key
    # mountable as a subcommand (`osfl flower certs`)
    parser = argparse.ArgumentParser(prog="osfl")
    sub = parser.add_subparsers(dest="cmd").add_parser("certs")
    certs.add_arguments(sub)
    ns = parser.parse_args(["certs", str(tmp_path / "d"), "--days", "3"])
    assert certs.run(ns) == 0 and (tmp_path / "d" / "server.pem").is_file()


# --------------------------------------------------------------------------- node config
def test_node_config_string_round_trips_through_flowers_parser() -> None:
    from flwr.common.config import parse_config_args

    entries = {
        "partition-id": 2,
        "num-partitions": 3,
        "data": "imagefolder:/srv/site 3",
        "note": 'say "hi", it\'s a back\\slash\nand a tab\t',
        "scale": 0.25,
        "gpu": False,
        "site.name": "Zürich",
    }
    text = node_config_string(entries)
    assert text.startswith("partition-id=2 num-partitions=3 ")
    assert parse_config_args([text]) == entries


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ({"bad key": 1}, "must be letters"),
        ({"k=v": 1}, "must be letters"),
        ({"x": [1]}, "str, int, float or bool"),
        ({"x": float("nan")}, "finite"),
        ({"a": 1, "a.b": 2}, "clash"),
    ],
)
def test_node_config_string_refuses_what_flower_cannot_read(entries: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        node_config_string(entries)


def test_local_federation_refuses_bad_security_and_node_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="node_auth=True needs tls=True"):
        LocalFederation(2, tmp_path, node_auth=True)
    with pytest.raises(ConfigError, match="list of 2 mappings"):
        LocalFederation(2, tmp_path, node_configs=[{"data": "x"}])
    with pytest.raises(ConfigError, match=r"node_configs\[1\] sets partition-id"):
        LocalFederation(2, tmp_path, node_configs=[{}, {"partition-id": 0}])
    with pytest.raises(ConfigError, match="must be letters"):
        LocalFederation(2, tmp_path, node_configs=[{}, {"has space": 0}])
    fed = LocalFederation(2, tmp_path, node_configs=[{"data": "a b"}, {}])
    assert fed.node_config_strings == [
        'partition-id=0 num-partitions=2 data="a b"',
        "partition-id=1 num-partitions=2",
    ]
    with pytest.raises(ConfigError, match="started federation"):
        fed.spawn_node("late")
    with pytest.raises(ConfigError, match="no SuperNode 0"):
        fed.node_pids(0)
    assert not list(tmp_path.iterdir())  # nothing made before start()


# --------------------------------------------------------------------------- real processes (slow)


def _tree(fed: LocalFederation) -> list[int]:
    return [pid for p in fed.procs if p.poll() is None for pid in [p.pid, *descendants(p.pid)]]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float = 90.0) -> int:
    """The refused node's exit status (Flower exits a node it cannot connect)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the node was not refused within {timeout:.0f} s") from e


def _run_tiny_job(fed: LocalFederation, out: Path) -> float:
    from osfl.flower.spec import JobSpec

    run = fed.run(
        JobSpec(method="fedavg", overrides=TINY_FLOWER_SECURITY, out_dir=str(out)), timeout=600
    )
    record = json.loads((run / "metrics.json").read_text())["records"][0]
    assert record["runtime"] == "flower" and record["method"] == "fedavg"
    return float(record["global_test_accuracy"])


@pytest.mark.slow
def test_tls_superlink_refuses_insecure_nodes_and_runs_a_job_over_tls(tmp_path: Path) -> None:
    """A SuperLink started with osfl's certificates speaks only HTTPS: a node
    without TLS gives up (plain HTTP gets no answer) and so does one trusting
    another CA; the TLS nodes run a FedAvg job end to end."""
    other_ca = make_certificates(tmp_path / "other-ca")
    started = time.monotonic()
    with LocalFederation(2, tmp_path / "fed", tls=True) as fed:
        tree = _tree(fed)
        link_log = (fed.workdir / "superlink.log").read_text()
        assert f"running on https://127.0.0.1:{fed.superlink_port}" in link_log
        assert "--ssl-certfile" in Path(f"/proc/{fed.procs[0].pid}/cmdline").read_text()
        plain = fed.spawn_node("plain", insecure=True, extra_args=["--max-retries", "2"])
        wrong = fed.spawn_node(
            "wrong-ca", extra_args=["--root-certificates", str(other_ca.ca_cert)]
        )
        assert _wait_exit(plain) != 0 and _wait_exit(wrong) != 0
        plain_log = (fed.workdir / "supernode-plain.log").read_text()
        wrong_log = (fed.workdir / "supernode-wrong-ca.log").read_text()
        assert "Failed to initialize the connection to the SuperLink" in plain_log
        assert "CERTIFICATE_VERIFY_FAILED" in wrong_log
        for text in (plain_log, wrong_log):
            assert "SuperNode ID:" not in text  # never got a node id
        assert len(fed.wait_online(2)) == 2
        assert len(fed.supernodes()) == 2  # the refused nodes left no trace
        for i in range(2):
            assert "SuperNode ID:" in (fed.workdir / f"supernode-{i}.log").read_text()
        accuracy = _run_tiny_job(fed, tmp_path / "run")
        tree += _tree(fed)
    print(f"TLS federation + job: {time.monotonic() - started:.1f} s, accuracy {accuracy:.4f}")
    assert accuracy > 0.2  # chance is 0.1
    assert not [pid for pid in tree if _running(pid)], "processes left running"


@pytest.mark.slow
def test_node_authentication_runs_registered_nodes_and_refuses_unknown_keys(
    tmp_path: Path,
) -> None:
    """With --enable-supernode-auth only the registered public keys get in: the
    federation's nodes (registered with `flwr supernode register`) come online
    under the node ids registration gave and run a job; a node with a key the
    SuperLink has never seen, and a TLS node with no key, are refused."""
    stranger = make_node_keys(tmp_path / "stranger", "stranger")
    started = time.monotonic()
    with LocalFederation(2, tmp_path / "fed", tls=True, node_auth=True) as fed:
        tree = _tree(fed)
        assert len(set(fed.registered_node_ids)) == 2
        unknown = fed.spawn_node("unknown", private_key=stranger.private_key)
        keyless = fed.spawn_node("keyless")
        assert _wait_exit(unknown) != 0 and _wait_exit(keyless) != 0
        unknown_log = (fed.workdir / "supernode-unknown.log").read_text()
        keyless_log = (fed.workdir / "supernode-keyless.log").read_text()
        assert "Failed to activate SuperNode" in unknown_log
        assert "All SuperNodes must be registered via the CLI" in keyless_log
        link_log = (fed.workdir / "superlink.log").read_text()
        assert "No SuperNode found with the given public key" in link_log
        assert fed.wait_online(2) == sorted(fed.registered_node_ids)
        accuracy = _run_tiny_job(fed, tmp_path / "run")
        tree += _tree(fed)
    print(f"node-auth federation + job: {time.monotonic() - started:.1f} s, acc {accuracy:.4f}")
    assert accuracy > 0.2
    assert not [pid for pid in tree if _running(pid)], "processes left running"


@pytest.mark.slow
def test_node_configs_reach_the_nodes_and_kill_node_ends_one_node(tmp_path: Path) -> None:
    """Each node is started with its own node config (read back with Flower's
    parser from the process's command line); kill_node SIGKILLs one node and
    its descendants and leaves the others running."""
    from flwr.common.config import parse_config_args

    extra = [{"data": "imagefolder:/srv/site 0"}, {"data": 'C:\\ "quoted"', "weight": 0.5}]
    with LocalFederation(2, tmp_path / "fed", node_configs=extra) as fed:
        for i in range(2):
            argv = Path(f"/proc/{fed.nodes[i].pid}/cmdline").read_bytes().split(b"\0")
            value = argv[argv.index(b"--node-config") + 1].decode()
            assert parse_config_args([value]) == {
                "partition-id": i,
                "num-partitions": 2,
                **extra[i],
            }
        deadline = time.monotonic() + 30  # the node's flower-superexec child
        while len(fed.node_pids(0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        doomed = fed.node_pids(0)
        assert len(doomed) >= 2
        fed.kill_node(0)
        assert not [pid for pid in doomed if _running(pid)]
        assert fed.nodes[0].returncode == -9
        assert fed.node_pids(0) == [] and _running(fed.nodes[1].pid)
