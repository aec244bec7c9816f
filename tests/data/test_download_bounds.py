"""``osfl data get`` against a hostile server (issue 51): a download is
bounded in total time and size, not only per socket read, and a redirect
keeps to http(s). The servers run on 127.0.0.1 (tests/support/local_http.py):
one trickles a byte at a time, one streams an endless body without a
``Content-Length``, one announces more than the bound, one redirects to
``ftp://`` and ``file://``. Each ends in one line, exit 2, and no part file."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from osfl.data import download
from osfl.data.download import Limits, RemoteFile
from osfl.errors import ConfigError, DataError
from osfl.registry import Registry
from support.local_http import serving
from support.smoke import exit_2


class _Hostile(SimpleHTTPRequestHandler):
    """Answers by path: ``/trickle``, ``/endless``, ``/huge``, ``/ftp``,
    ``/file``, ``/loop``, ``/ok`` (64 bytes, the good case)."""

    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rsplit("/", 1)[-1]
        try:
            if path in ("ftp", "file", "loop"):
                target = {"ftp": "ftp://127.0.0.1/x.tgz", "file": "file:///etc/passwd"}
                self.send_response(302)
                self.send_header("Location", target.get(path, self.path))
                self.end_headers()
                return
            self.send_response(200)
            if path == "huge":
                self.send_header("Content-Length", str(1 << 40))
            if path == "ok":
                self.send_header("Content-Length", "64")
            self.end_headers()
            if path == "ok":
                self.wfile.write(b"x" * 64)
            elif path == "trickle":
                for _ in range(400):  # a byte every 50 ms: 20 s unless cut off
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif path == "endless":
                block = b"y" * 65536
                for _ in range(1 << 14):  # 1 GiB unless cut off
                    self.wfile.write(block)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what it should do


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with serving(tmp_path, monkeypatch, _Hostile) as base:
        yield base


def _fetch(url: str, tmp_path: Path, limits: Limits, md5: str = "0" * 32) -> Path:
    dest = tmp_path / "out.bin"
    download.download_file(url, dest, md5, download.DownloadProgress(), limits)
    return dest


def test_a_trickling_server_is_cut_off_at_the_total_timeout(url, tmp_path) -> None:
    # 400 bytes over 20 s: without the total bound the transfer would finish
    # and fail on its checksum instead (the 60-s per-read timeout never trips)
    with pytest.raises(DataError, match=r"took more than 1 s .*raise --timeout"):
        _fetch(f"{url}/trickle", tmp_path, Limits(timeout_s=1.0))
    assert not list(tmp_path.glob("*.part"))


def test_an_endless_body_without_a_length_is_cut_off_at_max_bytes(url, tmp_path) -> None:
    with pytest.raises(DataError, match=r"larger than 1,048,576 bytes .*--max-bytes"):
        _fetch(f"{url}/endless", tmp_path, Limits(max_bytes=1 << 20))
    assert not list(tmp_path.glob("*.part")) and not (tmp_path / "out.bin").exists()


def test_an_announced_size_over_the_bound_is_refused_before_reading(url, tmp_path) -> None:
    with pytest.raises(DataError, match=r"is 1,099,511,627,776 bytes, more than"):
        _fetch(f"{url}/huge", tmp_path, Limits(max_bytes=1 << 20))


@pytest.mark.parametrize(
    ("path", "says"), [("ftp", r"only http\(s\) URLs"), ("file", "not allowed")]
)
def test_a_redirect_leaves_http_only_to_be_refused(url, tmp_path, path, says) -> None:
    with pytest.raises(DataError, match=says):
        _fetch(f"{url}/{path}", tmp_path, Limits())


def test_a_redirect_loop_is_one_error(url, tmp_path) -> None:
    with pytest.raises(DataError, match="cannot download"):
        _fetch(f"{url}/loop", tmp_path, Limits())


def test_within_the_bounds_a_file_arrives_whole(url, tmp_path) -> None:
    md5 = hashlib.md5(b"x" * 64).hexdigest()
    dest = _fetch(f"{url}/ok", tmp_path, Limits(timeout_s=5, max_bytes=64), md5)
    assert dest.read_bytes() == b"x" * 64
    with pytest.raises(DataError, match="is 64 bytes, more than the 63"):
        _fetch(f"{url}/ok", tmp_path, Limits(max_bytes=63), md5)


def test_the_command_takes_the_bounds_and_refuses_bad_ones(url, tmp_path, capsys, monkeypatch):
    table: Registry[download.Downloadable] = Registry("downloadable dataset")
    table.add("mnist", download.Downloadable("mnist", (RemoteFile(f"{url}/endless", "0" * 32),)))
    monkeypatch.setattr(download, "DOWNLOADS", table)
    monkeypatch.setattr("osfl.commands.data.DOWNLOADS", table)
    args = ["data", "get", "mnist", "--cache", str(tmp_path / "c")]
    line = exit_2(capsys, [*args, "--max-bytes", "1M"])
    assert "larger than 1,048,576 bytes" in line, line
    assert "--timeout must be a positive" in exit_2(capsys, [*args, "--timeout", "0"])
    assert "--timeout must be a positive" in exit_2(capsys, [*args, "--timeout", "inf"])
    assert "--max-bytes must be" in exit_2(capsys, [*args, "--max-bytes", "-5"])
    with pytest.raises(ConfigError, match="--max-bytes"):
        Limits(max_bytes=0)


def test_the_defaults_are_the_documented_ones() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "data.md").read_text()
    assert download.DEFAULT_TIMEOUT_S == 1800 and download.DEFAULT_MAX_BYTES == 1 << 30
    assert "--timeout" in docs and "1800 s" in docs and "1 GiB" in docs
