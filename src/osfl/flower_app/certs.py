"""TLS certificates and SuperNode keys for a Flower rehearsal of osfl.

A Flower SuperLink serves its Fleet, Control and Runtime APIs over TLS when
started with ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``; a SuperNode
(and the ``flwr`` CLI) trusts it through ``--root-certificates`` (or
``root-certificates`` in ``FLWR_HOME/config.toml``). For a rehearsal there is
no real CA at hand, so :func:`make_certificates` makes a throwaway one: a
self-signed CA certificate and a server certificate it signs, valid for the
given host names and IP addresses. The CA's private key is never written:
nothing else can ever be signed by that CA, so there is nothing to protect
but the server key.

:func:`make_node_keys` makes a SuperNode's authentication key pair the way
Flower 1.41 reads it (``flwr/supernode/cli/flower_supernode.py``:
``load_ssh_private_key``; ``flwr/cli/supernode/register.py``:
``load_ssh_public_key``, NIST curves only): an ECDSA P-384 key pair in
OpenSSH format, like ``ssh-keygen -t ecdsa -b 384 -N ""``.

Run as ``python -m osfl.flower_app.certs DIR [--host H ...] [--node-keys N]``
(mounted by the CLI as ``osfl flower certs``); it prints the commands that
start a SuperLink and its SuperNodes with them, register the node keys and
run a job: a bash script that runs as printed on one machine, offline. See
``docs/flower-security.md``. Reference: Flower docs, "Enable TLS connections"
and "Authenticate SuperNodes", https://flower.ai/docs/framework/.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from osfl.errors import ConfigError

#: File names inside the certificate directory (the names Flower's docs use).
CA_CERT = "ca.crt"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
DEFAULT_DAYS = 30
#: The longest validity ``--days`` accepts: 100 years. A rehearsal certificate
#: is throwaway; past about 2.9 million days the end date would not fit in a
#: date at all (year 9999), and no verifier needs more than this.
MAX_DAYS = 36_500
#: The SuperLink port the printed commands use (Fleet, Control and Runtime APIs on one
#: HTTP port in Flower 1.41, whose own default is 8000); docs/flower.md uses it too.
FLOWER_PORT = 9093
#: SuperNode ``i`` of the printed commands serves its ClientApp API on this port + ``i``
#: (nodes sharing a machine need different ports; Flower's default is 9094 for all).
NODE_PORT = 9100
#: The most SuperNode key pairs ``--node-keys`` makes: the printed commands
#: start one SuperNode per key on this machine, each on its own port.
MAX_NODE_KEYS = 1000
#: The ``flwr`` CLI connection the printed commands write and use.
CONNECTION = "osfl-tls"
#: Certificates start this long before "now", so that a machine whose clock is
#: a little behind the one that made them still accepts them.
CLOCK_SKEW = datetime.timedelta(minutes=5)
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class CertPaths:
    """Where :func:`make_certificates` wrote the CA certificate (what clients
    trust: ``--root-certificates``), the server certificate and its key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    def superlink_flags(self) -> list[str]:
        """``flower-superlink`` arguments that turn TLS on with these files."""
        return [
            "--ssl-ca-certfile",
            str(self.ca_cert),
            "--ssl-certfile",
            str(self.server_cert),
            "--ssl-keyfile",
            str(self.server_key),
        ]

    def supernode_flags(self) -> list[str]:
        """``flower-supernode`` arguments that make it trust this CA."""
        return ["--root-certificates", str(self.ca_cert)]


@dataclass(frozen=True)
class NodeKeyPaths:
    """A SuperNode's key pair: the private key starts the node
    (``--auth-supernode-private-key``), the public key is registered with the
    SuperLink (``flwr supernode register``)."""

    private_key: Path
    public_key: Path


def check_days(days: int) -> None:
    """``days`` is a validity the certificates can carry: 1 to :data:`MAX_DAYS`."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(
            f"days must be a positive integer of at most {MAX_DAYS} (100 years; a rehearsal "
            f"certificate is throwaway), got {_short(days)}"
        )


def check_port(port: int, what: str = "--port") -> None:
    """``port`` is a TCP port a server can listen on: 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"{what} must be a TCP port from 1 to 65535, got {_short(port)}")


def _short(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (a refusal stays one short line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _check_hosts(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """Each host as a subjectAltName: an IP address or a host name as RFC 1123
    §2.1 allows it (labels of letters, digits and inner hyphens; a name that
    looks like a dotted-decimal address, such as ``999.1.1.1``, is neither,
    since a host name's top-level label is never all digits)."""
    if isinstance(hosts, str) or not hosts:
        raise ConfigError(
            f"hosts must be a non-empty list of host names or IP addresses, got {hosts!r}"
        )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        labels = str(host).rstrip(".").split(".")
        if (
            not isinstance(host, str)
            or not host
            or len(host) > 253
            or not all(_DNS_LABEL.match(x) for x in labels)
            or labels[-1].isdigit()
        ):
            raise ConfigError(
                f"host {_short(host)} is neither an IP address nor a valid DNS name (an "
                "RFC 1123 host name: letters, digits, hyphens and dots, the last label not all "
                "digits)"
            )
        names.append(x509.DNSName(host))
    return names


def _refuse_existing(paths: Sequence[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"refusing to overwrite {', '.join(existing)}: pass overwrite=True "
            "(--overwrite) or choose another directory"
        )


def _make_dir(directory: str | Path) -> Path:
    root = Path(directory).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a fresh file created with ``mode``: a key never
    exists, not even for a moment, with wider permissions."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask may have narrowed it; make it exact


def make_certificates(
    directory: str | Path,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = DEFAULT_DAYS,
    overwrite: bool = False,
) -> CertPaths:
    """Make a throwaway CA and a server certificate it signs, valid ``days``
    days for ``hosts`` (IP addresses and DNS names; a SuperNode must reach the
    SuperLink by one of them), in ``directory`` (created if missing). Keep
    ``127.0.0.1`` among them: the SuperLink's own ``flower-superexec``
    connects to its ``--host`` (``0.0.0.0`` read as ``127.0.0.1``) and
    verifies this certificate there (``flwr/supercore/address.py``).

    Writes ``ca.crt`` and ``server.pem`` (0644) and ``server.key`` (0600);
    refuses to replace any of them unless ``overwrite``. Keys are ECDSA P-256
    (TLS 1.2/1.3 with OpenSSL, gRPC and Python's ``ssl`` alike); the server
    certificate carries the extensions strict verifiers require (SAN,
    serverAuth, authority/subject key identifiers).
    """
    check_days(days)
    san = _check_hosts(hosts)
    root = _make_dir(directory)
    paths = CertPaths(root / CA_CERT, root / SERVER_CERT, root / SERVER_KEY)
    _refuse_existing([paths.ca_cert, paths.server_cert, paths.server_key], overwrite)

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - CLOCK_SKEW, now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "osfl rehearsal CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(hosts[0]))]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    _write(paths.ca_cert, ca_cert.public_bytes(pem), 0o644)
    _write(paths.server_cert, server_cert.public_bytes(pem), 0o644)
    _write(
        paths.server_key,
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        0o600,
    )
    return paths


def make_node_keys(directory: str | Path, name: str, *, overwrite: bool = False) -> NodeKeyPaths:
    """Make a SuperNode key pair ``<name>`` (private, 0600) and
    ``<name>.pub`` (OpenSSH public key line) in ``directory``: ECDSA P-384,
    unencrypted, the format ``flower-supernode --auth-supernode-private-key``
    and ``flwr supernode register`` read."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or "") or name.startswith("."):
        raise ConfigError(f"node key name {name!r} must be a plain file name ([A-Za-z0-9_.-])")
    root = _make_dir(directory)
    paths = NodeKeyPaths(root / name, root / f"{name}.pub")
    _refuse_existing([paths.private_key, paths.public_key], overwrite)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write(paths.private_key, private, 0o600)
    _write(paths.public_key, public + f" osfl-{name}\n".encode(), 0o644)
    return paths


# --------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (so that ``osfl flower certs`` can mount it)."""
    parser.add_argument("directory", help="directory to write into (created if missing)")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="host name or IP address the SuperNodes use to reach the SuperLink "
        f"(repeatable); {' and '.join(DEFAULT_HOSTS)} are always included: the "
        "SuperLink's own flower-superexec connects to it there",
    )
    parser.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"validity in days, 1 to {MAX_DAYS} (default: %(default)s)",
    )
    parser.add_argument(
        "--node-keys",
        type=int,
        default=0,
        metavar="N",
        help="also make N SuperNode key pairs (supernode-0 .. supernode-N-1) for "
        "SuperNode authentication",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=FLOWER_PORT,
        help="the SuperLink port the printed commands use (default: %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace files that already exist")


def run(args: argparse.Namespace) -> int:
    """Make the files ``args`` asks for and print how to use them."""
    if not 0 <= args.node_keys <= MAX_NODE_KEYS:
        raise ConfigError(
            f"--node-keys must be from 0 to {MAX_NODE_KEYS} (one SuperNode each, on ports "
            f"{NODE_PORT} and up), got {_short(args.node_keys)}"
        )
    # dict.fromkeys: the user's hosts first (the first names the certificate), no repeats
    hosts = tuple(dict.fromkeys([*args.host, *DEFAULT_HOSTS]))
    # every argument is checked before anything is made or printed: a refusal leaves nothing
    check_days(args.days)
    check_port(args.port)
    _check_hosts(hosts)
    if args.port in range(NODE_PORT, NODE_PORT + (args.node_keys or 3)):
        raise ConfigError(
            f"--port {args.port} is a port the printed SuperNodes serve on "
            f"({NODE_PORT}..{NODE_PORT + (args.node_keys or 3) - 1}); choose another"
        )
    root = Path(args.directory).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} exists and is not a directory")
    names = [CA_CERT, SERVER_CERT, SERVER_KEY]
    names += [f"supernode-{i}{ext}" for i in range(args.node_keys) for ext in ("", ".pub")]
    _refuse_existing([root / n for n in names], args.overwrite)
    paths = make_certificates(args.directory, hosts=hosts, days=args.days, overwrite=args.overwrite)
    keys = [
        make_node_keys(paths.ca_cert.parent, f"supernode-{i}", overwrite=args.overwrite)
        for i in range(args.node_keys)
    ]
    sys.stdout.write("\n".join(start_commands(paths, keys, hosts, args.days, args.port)) + "\n")
    return 0


def start_commands(
    paths: CertPaths,
    keys: Sequence[NodeKeyPaths],
    hosts: Sequence[str],
    days: int,
    port: int = FLOWER_PORT,
) -> list[str]:
    """What ``osfl flower certs`` prints: which files it wrote, then a bash
    script that, as printed and offline, starts a SuperLink with TLS (and node
    authentication with ``keys``), writes the ``flwr`` CLI's connection in a
    Flower home of its own, registers the keys, starts one SuperNode per key
    (three without keys), each on its own port, and runs a FedAvg job."""
    paths = CertPaths(*(p.resolve() for p in (paths.ca_cert, paths.server_cert, paths.server_key)))
    ca, tls = paths.ca_cert, paths.ca_cert.parent
    n = len(keys) or 3
    link = f"{_addr(hosts[0])}:{port}"
    auth = " --enable-supernode-auth" if keys else ""
    flags = " ".join(paths.superlink_flags())
    made = f" and {len(keys)} SuperNode key pairs (supernode-<i>, .pub)" if keys else ""
    out = [
        f"wrote {ca}, {paths.server_cert}, {paths.server_key}{made}",
        f"(valid {days} days for {', '.join(hosts)}; SuperNodes must reach the SuperLink by one "
        "of these names)",
        "",
        "# The commands below run as printed, on this machine and offline. Across machines:",
        "# start the SuperLink with --host 0.0.0.0, and give each site a copy of "
        f"{CA_CERT} and its own",
        "# private key (nothing else) for its SuperNode's command.",
        f"export FLWR_HOME={tls / 'flwr-home'}  # flwr's settings here: ~/.flwr is not touched",
        "# 1. the SuperLink (TLS" + (", node authentication)" if keys else ")"),
        f"flower-superlink {flags}{auth} --disable-runtime-dependency-installation --port {port} &",
        f'# 2. the flwr CLI\'s connection "{CONNECTION}", then wait for the SuperLink',
        'mkdir -p "$FLWR_HOME" && cat > "$FLWR_HOME/config.toml" <<EOF',
        "[superlink]",
        f'default = "{CONNECTION}"',
        "",
        f"[superlink.{CONNECTION}]",
        f'address = "{link}"',
        f'root-certificates = "{ca}"',
        "EOF",
        f"for t in $(seq 60); do flwr ls {CONNECTION} >/dev/null 2>&1 && break; sleep 1; done",
    ]
    if keys:
        out.append("# 3. register each SuperNode's public key (prints the node id it gets)")
        out += [f"flwr supernode register {k.public_key.resolve()} {CONNECTION}" for k in keys]
    out.append("# 4. the SuperNodes; on one machine each needs its own --port (its ClientApp API)")
    for i in range(n):
        key = f" --auth-supernode-private-key {keys[i].private_key.resolve()}" if keys else ""
        out.append(
            f"flower-supernode --superlink {link} --root-certificates {ca}{key} "
            f'--port {NODE_PORT + i} --node-config "partition-id={i} num-partitions={n}" &'
        )
    out += [
        f"# 5. an app for {n} clients and one FedAvg run (stop the processes afterwards: kill %1 ...)",
        f"python -m osfl.flower_app ./osfl-app --method fedavg --override partition.num_clients={n}",
        f"flwr run ./osfl-app {CONNECTION} --stream",
    ]
    return out


def _addr(host: str) -> str:
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    return host


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m osfl.flower_app.certs DIR [--host H ...] [--days N]
    [--node-keys N] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="python -m osfl.flower_app.certs",
        description="Make a throwaway CA, a server certificate (and SuperNode keys) "
        "for a TLS Flower rehearsal.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
