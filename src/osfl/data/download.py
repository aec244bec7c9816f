"""``osfl data get NAME``: fetch a dataset's official files into a local cache,
check them against their published MD5 checksums, unpack archives safely and
name the data spec that reads them.

Why: CIFAR, MNIST and SVHN are the benchmarks of the FL literature, and a run
should read the very bytes their authors published. Each file's URL and MD5 are
the values torchvision's dataset classes list (``torchvision/datasets/cifar.py``
``CIFAR10.tgz_md5`` / ``CIFAR100.tgz_md5``, ``mnist.py`` ``MNIST.resources`` and
``MNIST.mirrors``, ``svhn.py`` ``SVHN.split_list``), which match the official
pages:

- CIFAR-10 / CIFAR-100, "python version" (Krizhevsky, 2009, "Learning Multiple
  Layers of Features from Tiny Images"; https://www.cs.toronto.edu/~kriz/cifar.html);
- MNIST, the four idx files (LeCun, Bottou, Bengio & Haffner, 1998;
  http://yann.lecun.com/exdb/mnist/), from the S3 mirror torchvision uses since
  the original host began refusing downloads;
- SVHN, cropped digits "format 2" (Netzer et al., NeurIPS workshop 2011, "Reading
  Digits in Natural Images with Unsupervised Feature Learning";
  http://ufldl.stanford.edu/housenumbers/).

How: each file streams with urllib to ``<file>.part`` (a progress callback
reports bytes; the command draws a bar in a terminal, a log line otherwise), is
hashed on the way, and is renamed into place only when its MD5 matches; a
mismatch deletes it and raises one :class:`~osfl.errors.DataError` naming the
expected and the received digest. A file already present with the right MD5 is
not fetched again. Archives are unpacked into a temporary folder whose top
entries are then renamed into place, so a half-unpacked folder is never taken
for a complete one. Every member is checked first (regular files and folders
only, no absolute path, no ``..``, nothing landing outside the target) and
``tarfile``'s ``data`` filter is applied as well where Python has it.

The cache is ``--cache DIR``, else ``$OSFL_DATA_CACHE``, else
``~/.cache/osfl/data``; ``--mirror URL`` (or ``$OSFL_DATA_MIRROR``) replaces the
scheme and host of every URL, keeping its path, for a local mirror (and the
tests' server on 127.0.0.1).

Bounds (issue 51): a server is a peer, so a download is bounded in total
time and size, not only per socket read. A server trickling one byte every
few seconds never trips a per-read timeout, and a body without a
``Content-Length`` would stream to disk for ever. Each file must arrive
within ``timeout_s`` (default :data:`DEFAULT_TIMEOUT_S`, 30 minutes: the
largest official file is 182 MiB) and hold at most ``max_bytes`` (default
:data:`DEFAULT_MAX_BYTES`, 1 GiB); ``osfl data get --timeout S --max-bytes
N`` raises them. A redirect is followed only to another http(s) URL (never
``ftp://`` or ``file://``), at most :data:`MAX_REDIRECTS` times.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from osfl.errors import ConfigError, DataError
from osfl.registry import Registry

log = logging.getLogger(__name__)

CACHE_ENV = "OSFL_DATA_CACHE"
MIRROR_ENV = "OSFL_DATA_MIRROR"
DEFAULT_CACHE = "~/.cache/osfl/data"
_CHUNK = 1 << 20
#: The longest wait for one read of the socket (a stalled connection).
READ_TIMEOUT_S = 60.0
#: The longest one file's download may take, and the most bytes it may hold.
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_MAX_BYTES = 1 << 30
MAX_REDIRECTS = 5
_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class RemoteFile:
    """One published file: where it is, and its published MD5."""

    url: str
    md5: str
    #: a tar archive to unpack into the dataset's folder once verified
    unpack: bool = False

    @property
    def name(self) -> str:
        return PurePosixPath(urllib.parse.urlsplit(self.url).path).name


@dataclass(frozen=True)
class Downloadable:
    """A dataset ``osfl data get`` knows: its files, and the data source that
    reads them from ``<cache>/<name>/<folder>``."""

    source: str
    files: tuple[RemoteFile, ...]
    folder: str = ""
    what: str = ""


#: name -> its files. Add a dataset with ``DOWNLOADS.add(name, Downloadable(...))``.
DOWNLOADS: Registry[Downloadable] = Registry("downloadable dataset")

_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist/"
DOWNLOADS.add(
    "cifar10",
    Downloadable(
        source="cifar10",
        files=(
            RemoteFile(
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
                unpack=True,
            ),
        ),
        folder="cifar-10-batches-py",
        what="CIFAR-10, python version (163 MiB)",
    ),
)
DOWNLOADS.add(
    "cifar100",
    Downloadable(
        source="cifar100",
        files=(
            RemoteFile(
                "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                "eb9058c3a382ffc7106e4002c42a8d85",
                unpack=True,
            ),
        ),
        folder="cifar-100-python",
        what="CIFAR-100, python version (161 MiB)",
    ),
)
DOWNLOADS.add(
    "mnist",
    Downloadable(
        source="mnist",
        files=(
            RemoteFile(_MNIST + "train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
            RemoteFile(_MNIST + "train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
            RemoteFile(_MNIST + "t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
            RemoteFile(_MNIST + "t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
        ),
        what="MNIST, idx files (11 MiB)",
    ),
)
DOWNLOADS.add(
    "svhn",
    Downloadable(
        source="svhn",
        files=(
            RemoteFile(
                "http://ufldl.stanford.edu/housenumbers/train_32x32.mat",
                "e26dedcc434d2e4c54c9b2d4a06d8373",
            ),
            RemoteFile(
                "http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
                "eb5a983be6a315427106f1b164d9cef3",
            ),
        ),
        what="SVHN, cropped digits train + test (246 MiB)",
    ),
)


class DownloadProgress:
    """What a download reports: the default logs one line per file; the
    command passes a subclass that draws a progress bar in a terminal."""

    def start(self, name: str, url: str, total: int | None) -> None:
        size = f" ({total:,} bytes)" if total else ""
        log.info("downloading %s%s", url, size)

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes of the current file arrived."""

    def finish(self) -> None:
        """The current file is complete (or failed)."""


@dataclass
class Fetched:
    """What :func:`get_dataset` did, and the spec that reads the result."""

    name: str
    root: Path
    spec: str
    downloaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def override(self) -> str:
        """The config override that reads it, quoted for a shell where needed."""
        return shlex.quote(f"data.source={self.spec}")


def cache_root(cache: str | os.PathLike[str] | None = None) -> Path:
    """``cache``, else ``$OSFL_DATA_CACHE``, else ``~/.cache/osfl/data`` (absolute)."""
    chosen = cache if cache else os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser().absolute()


def mirror_url(url: str, mirror: str | None) -> str:
    """``url`` with its scheme and host replaced by ``mirror``'s (any path of
    the mirror goes before the file's own path)."""
    if not mirror:
        return url
    m = urllib.parse.urlsplit(mirror)
    if m.scheme not in ("http", "https") or not m.netloc:
        raise ConfigError(f"--mirror must be an http(s) URL like http://host:port/, got {mirror!r}")
    path = urllib.parse.urlsplit(url).path
    return urllib.parse.urlunsplit((m.scheme, m.netloc, m.path.rstrip("/") + path, "", ""))


def md5_of(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, kept to http(s): its own handler also follows a
    server's redirect to ``ftp://``, which no dataset host needs."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str):
        scheme = urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, newurl)).scheme
        if scheme.lower() not in _SCHEMES:
            raise DataError(
                f"refusing the redirect of {req.full_url} to {newurl[:200]!r}: only http(s) "
                "URLs are fetched"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


def _open(url: str, timeout_s: float) -> tuple[Any, int | None]:
    try:
        resp = _OPENER.open(url, timeout=min(READ_TIMEOUT_S, timeout_s))
    except urllib.error.HTTPError as e:
        raise DataError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"cannot download {url}: {reason}") from None
    length = resp.headers.get("Content-Length")
    return resp, int(length) if length and length.isdigit() else None


@dataclass(frozen=True)
class Limits:
    """How long one file's download may take and how large it may be."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s < float("inf")):
            raise ConfigError(
                f"--timeout must be a positive number of seconds, got {self.timeout_s!r}"
            )
        if (
            isinstance(self.max_bytes, bool)
            or not isinstance(self.max_bytes, int)
            or self.max_bytes < 1
        ):
            raise ConfigError(f"--max-bytes must be a positive byte count, got {self.max_bytes!r}")


def _stream(
    resp: Any, out: Any, h: Any, url: str, limits: Limits, progress: DownloadProgress
) -> None:
    """Copy ``resp`` to ``out`` within ``limits``: ``read1`` returns what one
    read of the socket brought, so the deadline is checked between reads of
    at most :data:`READ_TIMEOUT_S` (``read`` would wait for a whole chunk)."""
    deadline = time.monotonic() + limits.timeout_s
    got = 0
    while chunk := resp.read1(_CHUNK):
        got += len(chunk)
        if got > limits.max_bytes:
            raise DataError(
                f"download of {url} is larger than {limits.max_bytes:,} bytes (the most osfl "
                "takes of one file; --max-bytes raises it)"
            )
        out.write(chunk)
        h.update(chunk)
        progress.advance(len(chunk))
        if time.monotonic() > deadline:
            raise DataError(
                f"download of {url} took more than {limits.timeout_s:g} s ({got:,} bytes "
                "arrived): a slow or stalled server; try again, use --mirror, or raise --timeout"
            )


def download_file(
    url: str, dest: Path, md5: str, progress: DownloadProgress, limits: Limits | None = None
) -> None:
    """Stream ``url`` to ``dest.part`` within ``limits`` (module docstring),
    check its MD5, rename it to ``dest``. A mismatch, a broken transfer or a
    bound passed deletes the part file and raises a DataError."""
    limits = limits or Limits()
    if urllib.parse.urlsplit(url).scheme not in _SCHEMES:
        raise ConfigError(f"refusing to download {url!r}: only http(s) URLs are fetched")
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)  # whatever an earlier attempt left, even a FIFO
    h = hashlib.md5(usedforsecurity=False)
    resp, total = _open(url, limits.timeout_s)
    if total is not None and total > limits.max_bytes:
        resp.close()
        raise DataError(
            f"{url} is {total:,} bytes, more than the {limits.max_bytes:,} osfl takes of one "
            "file (--max-bytes raises it)"
        )
    progress.start(dest.name, url, total)
    try:
        with resp, open(part, "wb") as out:
            _stream(resp, out, h, url, limits, progress)
    except DataError:
        part.unlink(missing_ok=True)
        raise
    except OSError as e:  # includes a dropped connection, a read timeout and a full disk
        part.unlink(missing_ok=True)
        raise DataError(f"download of {url} broke off: {e}") from None
    finally:
        progress.finish()
    got = h.hexdigest()
    if got != md5:
        part.unlink(missing_ok=True)
        raise DataError(
            f"checksum mismatch for {url}: expected MD5 {md5}, got {got}; the file was "
            "deleted (a damaged download or a wrong mirror: run the command again)"
        )
    os.replace(part, dest)


def _check_members(archive: Path, tar: tarfile.TarFile, target: Path) -> list[tarfile.TarInfo]:
    """Every member, if each is a plain file or folder that lands inside
    ``target``; otherwise a DataError naming the first that does not."""
    members = tar.getmembers()
    base = target.resolve()
    for m in members:
        parts = PurePosixPath(m.name).parts
        where = (base / m.name).resolve()
        if not (m.isfile() or m.isdir()):
            why = "is a link or a device, not a plain file"
        elif m.name.startswith(("/", "\\")) or ".." in parts or not where.is_relative_to(base):
            why = f"would land outside {str(target)!r}"
        else:
            continue
        raise DataError(f"refusing to unpack {str(archive)!r}: member {m.name!r} {why}")
    return members


def unpack(archive: Path, target: Path) -> None:
    """Unpack a tar archive into ``target``: into a temporary folder first,
    whose top-level entries then replace those of ``target``."""
    tmp = target / f".unpacking-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _check_members(archive, tar, tmp)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.11.4 / 3.10.12: our member check only
                tar.extractall(tmp, members=members)  # members checked above
        for entry in sorted(tmp.iterdir()):
            dest = target / entry.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            elif dest.exists() or dest.is_symlink():
                dest.unlink()
            os.replace(entry, dest)
    except (tarfile.TarError, EOFError) as e:  # a corrupt archive, or one the filter refuses
        raise DataError(f"cannot unpack {str(archive)!r}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dataset_root(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """The folder the source of dataset ``name`` reads in the cache."""
    entry = DOWNLOADS.get(name)
    base = cache_root(cache) / name.lower()
    return base / entry.folder if entry.folder else base


def is_cached(name: str, cache: str | os.PathLike[str] | None = None) -> bool:
    """Every file of ``name`` present (unchecked: ``get`` checks) and unpacked."""
    entry = DOWNLOADS.get(name)
    base = cache_root(cache) / name.lower()
    return (
        all((base / f.name).is_file() for f in entry.files) and dataset_root(name, cache).is_dir()
    )


def get_dataset(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    mirror: str | None = None,
    progress: DownloadProgress | None = None,
    limits: Limits | None = None,
) -> Fetched:
    """Download (or find) every file of dataset ``name`` (each within
    ``limits``: time and size), verify it, unpack archives; return where it
    is and the data spec that reads it."""
    entry = DOWNLOADS.get(name)
    mirror = mirror if mirror else os.environ.get(MIRROR_ENV) or None
    progress = progress or DownloadProgress()
    base = cache_root(cache) / name.lower()
    base.mkdir(parents=True, exist_ok=True)
    root = dataset_root(name, cache)
    done = Fetched(name=name.lower(), root=root, spec=f"{entry.source}:{root}")
    for f in entry.files:
        dest = base / f.name
        fresh = not (dest.is_file() and md5_of(dest) == f.md5)
        if fresh:
            if dest.exists():
                log.warning("%s does not match its published MD5; downloading it again", dest)
            download_file(mirror_url(f.url, mirror), dest, f.md5, progress, limits)
            done.downloaded.append(f.name)
        else:
            log.info("%s is present and verified; skipped", dest)
            done.skipped.append(f.name)
        if f.unpack and (fresh or not root.is_dir()):
            unpack(dest, base)
    if not root.is_dir():
        raise DataError(f"{name}: the downloaded files hold no folder {entry.folder!r}")
    return done
