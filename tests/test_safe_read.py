"""Reading a file osfl did not just write (``osfl.safe_read``): a regular file
only (a FIFO, a device or a directory refused without blocking or reading),
inside its root and off links where asked, size-bounded, strict UTF-8 text
with no NUL, JSON bounded before parsing; each refusal one line of the
caller's error kind that names the file and never quotes it. The commands that
read hostile files through it: ``tests/commands/test_hostile_files.py``."""

from __future__ import annotations

import os

import pytest

from osfl.errors import ConfigError, DataError
from osfl.safe_read import read_bytes, read_json, read_text


# --------------------------------------------------------------------------- the shared reader
def test_the_reader_keeps_inside_its_root_and_off_links(tmp_path) -> None:
    from osfl.errors import ConfigError, DataError
    from osfl.safe_read import check_inside, read_bytes, read_text

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside")
    (tmp_path / "outside.txt").write_text("outside")
    assert check_inside(root / "sub" / "f.txt", root) == (root / "sub" / "f.txt").resolve()
    with pytest.raises(DataError, match="resolves outside"):
        check_inside(root / "sub" / ".." / ".." / "outside.txt", root)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(DataError, match=r"link is a symbolic link: refusing to follow it out of"):
        read_bytes(root / "link" / "outside.txt", max_bytes=100, inside=root)
    (root / "f-link.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(ConfigError, match="is a symbolic link: refusing to follow it"):
        read_text(root / "f-link.txt", max_bytes=100, follow_links=False, error=ConfigError)
    assert read_text(root / "f-link.txt", max_bytes=100) == "outside"  # a user's own link
    assert read_text(root / "sub" / "f.txt", max_bytes=6, inside=root) == "inside"
    with pytest.raises(DataError, match=r"is 6 bytes, more than the 5 bytes"):
        read_text(root / "sub" / "f.txt", max_bytes=5)
    (root / "bom.txt").write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_text(root / "bom.txt", max_bytes=100) == "a: 1\n"


def test_what_is_not_a_regular_file_is_refused_without_reading_it(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # a blocking open would wait here for ever
    with pytest.raises(DataError, match=r"^split .*pipe is a FIFO \(named pipe\), not a regular"):
        read_bytes(fifo, max_bytes=10, what="split")
    with pytest.raises(
        DataError, match=r"is a directory, not a regular file|is not a regular file"
    ):
        read_bytes(tmp_path, max_bytes=10)
    with pytest.raises(ConfigError, match=r"/dev/zero is a character device"):
        read_bytes("/dev/zero", max_bytes=10, error=ConfigError)  # never ends: no MemoryError
    with pytest.raises(DataError, match=r"missing\.json does not exist"):
        read_json(tmp_path / "missing.json", max_bytes=10)


def test_text_is_strict_utf8_without_nul_and_never_quoted(tmp_path) -> None:
    secret = "password: hunter2"
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(secret.encode() + b"\xff\n")
    with pytest.raises(ConfigError) as e:
        read_text(bad, max_bytes=100, what="config", error=ConfigError)
    assert str(e.value) == f"config {bad} is not UTF-8 text (byte {len(secret)})"
    bad.write_bytes(b"a: 1\x00\n")
    with pytest.raises(DataError, match=r"is not text \(a NUL byte at 4\)"):
        read_text(bad, max_bytes=100)


def test_json_is_bounded_before_it_is_parsed(tmp_path) -> None:
    doc = tmp_path / "d.json"
    doc.write_text('{"a": [1, 2, {"b": null}]}')
    assert read_json(doc, max_bytes=100) == {"a": [1, 2, {"b": None}]}
    doc.write_text("[" * 5000 + "]" * 5000)  # json.loads: RecursionError
    with pytest.raises(DataError, match=r"nested 5000 levels deep, more than 64"):
        read_json(doc, max_bytes=20_000)
    doc.write_text('{"a": 1,}')
    with pytest.raises(DataError, match=r"d\.json is not valid JSON \("):
        read_json(doc, max_bytes=100)
