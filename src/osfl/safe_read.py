"""Reading a file osfl did not just write, refusing bad content in one line.

Every file a user, a peer or an earlier process hands osfl (a config and its
``base:`` chain, a saved split, a kept model and its card, a tracker's ids, a
suite's plan, a pack's manifest, an event log) is read through
:func:`read_bytes`, :func:`read_text` or :func:`read_json`, which check what
``Path.read_text`` does not (issue 51, "Hostile peers and damaged files,
round four"):

- **what it is**: a regular file. A FIFO would block the reader for ever, a
  character device (``/dev/zero``) never ends and ends in a ``MemoryError``,
  a directory is an ``IsADirectoryError``. The file is opened non-blocking and
  checked with ``fstat`` on the open descriptor, so what is checked is what is
  read (no race between a check and the open);
- **where it is**: with ``follow_links=False`` a symbolic link is refused
  (``O_NOFOLLOW``), and with ``inside=ROOT`` the resolved path must lie
  under ``ROOT``: a file of a run directory must not be another run's;
- **how large**: at most ``max_bytes``, checked before reading and while
  reading (a file that grows is cut off, not read to the end);
- **its encoding**: strict UTF-8 (``read_text``);
- **its shape** (``read_json``): size and nesting bounded before parsing
  (:func:`osfl.jsonio.loads`), so a deeply nested document is a refusal and
  not a ``RecursionError``.

Every refusal is one :class:`~osfl.errors.OsflError` line of the caller's
kind (``error=ConfigError`` for a config, the default ``DataError`` for
data), naming the file and what is wrong with it and never quoting its
content: a config whose ``base:`` names ``/etc/passwd`` must not print that
file's lines.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from osfl import jsonio
from osfl.errors import DataError, OsflError

__all__ = ["GIB", "KIB", "MIB", "check_inside", "read_bytes", "read_json", "read_text"]

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
_CHUNK = 1 << 20

PathLike = str | os.PathLike[str]


def _kind(mode: int) -> str:
    """What a non-regular file is, in a user's words."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _size(n: int) -> str:
    """A byte count as a reader compares it: exact, then in binary units."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return f"{n:,} bytes ({n / scale:.1f} {unit})"
    return f"{n:,} bytes"


def check_inside(path: PathLike, root: PathLike, error: type[OsflError] = DataError) -> Path:
    """``path`` resolved, if it lies under ``root`` (resolved) and no part of
    it below ``root`` is a symbolic link; else one ``error`` line. The path
    need not exist (a missing file is the reader's to report)."""
    base = Path(root).resolve()
    p = Path(path)
    try:
        rel = p.absolute().relative_to(Path(root).absolute())
    except ValueError:
        raise error(f"{p} is outside {base}: refusing to follow it") from None
    at = base
    for part in rel.parts:
        at = at / part
        if at.is_symlink():
            raise error(f"{at} is a symbolic link: refusing to follow it out of {base}")
    resolved = p.resolve()
    if not resolved.is_relative_to(base):
        raise error(f"{p} resolves outside {base}: refusing to follow it")
    return resolved


def _open(path: Path, follow_links: bool, error: type[OsflError], what: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise error(f"{what} {path} is a symbolic link: refusing to follow it") from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing
            raise error(f"{what} {path} is not a regular file") from None
        raise error(f"{what} {path} cannot be read ({e.strerror})") from None


def read_bytes(
    path: PathLike,
    *,
    max_bytes: int,
    what: str = "file",
    error: type[OsflError] = DataError,
    follow_links: bool = True,
    inside: PathLike | None = None,
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (module
    docstring); ``what`` names it in a refusal (``"config file"``)."""
    p = Path(path)
    if inside is not None:
        check_inside(p, inside, error)
    fd = _open(p, follow_links, error, what)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise error(
                f"{what} {p} is {_size(st.st_size)}, more than the {_size(max_bytes)} "
                "osfl reads of it"
            )
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise error(f"{what} {p} grew past the {_size(max_bytes)} osfl reads of it")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"{what} {p} cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)


def read_text(
    path: PathLike,
    *,
    max_bytes: int,
    what: str = "file",
    error: type[OsflError] = DataError,
    follow_links: bool = True,
    inside: PathLike | None = None,
) -> str:
    """:func:`read_bytes`, decoded as strict UTF-8 (a NUL byte is refused
    too: no text file osfl reads holds one, and YAML and JSON parsers read
    one differently)."""
    blob = read_bytes(
        path, max_bytes=max_bytes, what=what, error=error, follow_links=follow_links, inside=inside
    )
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text (byte {e.start})") from None
    if "\x00" in text:
        raise error(f"{what} {path} is not text (a NUL byte at {text.index(chr(0))})")
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


def read_json(
    path: PathLike,
    *,
    max_bytes: int,
    max_depth: int = jsonio.MAX_DEPTH,
    what: str = "file",
    error: type[OsflError] = DataError,
    follow_links: bool = True,
    inside: PathLike | None = None,
) -> Any:
    """:func:`read_text`, parsed as JSON nested at most ``max_depth`` deep."""
    text = read_text(
        path, max_bytes=max_bytes, what=what, error=error, follow_links=follow_links, inside=inside
    )
    try:
        return jsonio.loads(text, max_depth=max_depth)
    except ValueError as e:
        raise error(f"{what} {path} is not valid JSON ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
