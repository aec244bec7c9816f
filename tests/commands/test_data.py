"""``osfl data get NAME`` / ``osfl data list``: MNIST files in the official
format served on 127.0.0.1 (nothing downloads), fetched into a cache; the
command prints the ``data.source=...`` override that reads them, and a bad
name or a 404 is one line with exit status 2."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from osfl.commands import data
from osfl.commands.common import dispatch, new_console
from osfl.data import download
from osfl.data.sources import load_data
from osfl.registry import Registry
from support.local_http import serving

MNIST = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """(the folder it serves, its base URL)."""
    www = tmp_path / "www"
    (www / "mnist").mkdir(parents=True)
    with serving(www, monkeypatch) as url:
        yield www, url


def _serve_mnist(www: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 28×28 images per split, and the checksum table pointed at them."""
    arrays = [
        np.full((2, 28, 28), 200, np.uint8),
        np.array([4, 2]),
        np.zeros((2, 28, 28)),
        np.array([1, 1]),
    ]
    md5s = []
    for name, a in zip(MNIST, arrays, strict=True):
        head = bytes([0, 0, 8, a.ndim]) + b"".join(d.to_bytes(4, "big") for d in a.shape)
        blob = gzip.compress(head + a.astype(np.uint8).tobytes(), mtime=0)
        (www / "mnist" / f"{name}.gz").write_bytes(blob)
        md5s.append(hashlib.md5(blob).hexdigest())
    table: Registry[download.Downloadable] = Registry("downloadable dataset")
    for name in download.DOWNLOADS.names():
        entry = download.DOWNLOADS.get(name)
        if name == "mnist":
            files = tuple(
                dataclasses.replace(f, md5=m) for f, m in zip(entry.files, md5s, strict=True)
            )
            entry = dataclasses.replace(entry, files=files)
        table.add(name, entry)
    monkeypatch.setattr(download, "DOWNLOADS", table)


def _osfl_data(argv: list[str]) -> int:
    """``osfl data ARGV`` through the parser this module adds and the CLI's dispatch."""
    parser = argparse.ArgumentParser(prog="osfl")
    data.add_parser(parser.add_subparsers(dest="command", required=True))
    new_console()
    return dispatch(parser.parse_args(["data", *argv]))


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        _osfl_data(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_get_downloads_and_prints_the_override_that_reads_it(
    server, tmp_path, monkeypatch, capsys
) -> None:
    www, url = server
    _serve_mnist(www, monkeypatch)
    cache = tmp_path / "cache"
    assert _osfl_data(["get", "mnist", "--cache", str(cache), "--mirror", url]) == 0
    root = cache / "mnist"
    files = ", ".join(f"{n}.gz" for n in MNIST)
    assert capsys.readouterr().out.splitlines() == [
        *[
            f"downloading {url}/mnist/{n}.gz ({(www / 'mnist' / f'{n}.gz').stat().st_size:,} bytes)"
            for n in MNIST
        ],
        f"downloaded and verified: {files}",
        f"mnist is in {root}; read it with",
        f"  osfl run data.source=mnist:{root}",
    ]
    assert load_data(f"mnist:{root}").train.labels.tolist() == [4, 2]
    assert _osfl_data(["get", "mnist", "--cache", str(cache), "--mirror", url]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"already verified: {files}"


def test_list_shows_what_is_cached(server, tmp_path, monkeypatch, capsys) -> None:
    www, url = server
    _serve_mnist(www, monkeypatch)
    cache = tmp_path / "c"
    _osfl_data(["get", "mnist", "--cache", str(cache), "--mirror", url])
    capsys.readouterr()
    assert _osfl_data(["list", "--cache", str(cache)]) == 0
    rows = {
        line.split()[1]: line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("│ ")
    }
    assert set(rows) == {"cifar10", "cifar100", "mnist", "svhn"}
    assert f"│ yes    │ mnist:{cache / 'mnist'}" in rows["mnist"]
    assert "│ no     │" in rows["svhn"]


def test_an_unknown_name_is_one_line_listing_the_valid_ones(tmp_path, capsys) -> None:
    line = _refusal(capsys, ["get", "svhm", "--cache", str(tmp_path)])
    assert line == (
        "osfl: error: unknown downloadable dataset 'svhm' (did you mean 'svhn'?); "
        "valid: cifar10, cifar100, mnist, svhn"
    )


def test_a_404_is_one_line(server, tmp_path, capsys) -> None:
    _, url = server
    line = _refusal(capsys, ["get", "mnist", "--cache", str(tmp_path / "c"), "--mirror", url])
    assert line == (
        f"osfl: error: cannot download {url}/mnist/train-images-idx3-ubyte.gz: "
        "HTTP 404 File not found"
    )
