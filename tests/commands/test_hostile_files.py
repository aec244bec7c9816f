"""Every file osfl reads refuses bad content in one line (issue 51, "Hostile
peers and damaged files, round four"): one hostile file of each kind — not
UTF-8, nested too deep, too large, a FIFO, ``/dev/zero``, a directory, the
wrong type — through the command that reads it: a config file and a
``base:`` (``osfl config show``), a saved split (``osfl run
partition.from_file=``), the trackers' ids (``osfl run --resume``), a kept
model's card, state and weights and the run's ``metrics.json`` (``osfl
eval``), the event log (``osfl flower status``). Each ends with exit 2 and
one ``osfl: error:`` line, never a traceback, a hang (an alarm fails the
test instead) or a silent acceptance."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from osfl.cli import main
from support.smoke import exit_2, tiny_cli_args

#: How each kind of hostile file is made at ``path`` (``json``: the reader
#: expects JSON, else YAML; ``limit``: its reader's size bound).
Make = Callable[[Path, bool, int], None]


def _not_utf8(path: Path, json: bool, limit: int) -> None:
    path.write_bytes(b'{"a": "\xff\xfe"}' if json else b"train: {lr: \xff\xfe}\n")


def _deep(path: Path, json: bool, limit: int) -> None:
    path.write_text(("[" * 5000 + "]" * 5000) if json else "a: " + "[" * 5000 + "]" * 5000)


def _large(path: Path, json: bool, limit: int) -> None:
    path.write_bytes(b"")
    os.truncate(path, limit + 1)  # sparse: nothing is written, the size is what counts


def _fifo(path: Path, json: bool, limit: int) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path, json: bool, limit: int) -> None:
    os.symlink("/dev/zero", path)


def _directory(path: Path, json: bool, limit: int) -> None:
    path.mkdir()


def _wrong_type(path: Path, json: bool, limit: int) -> None:
    path.write_text("[1, 2, 3]\n")


KINDS: dict[str, Make] = {
    "not-utf8": _not_utf8,
    "too-deep": _deep,
    "too-large": _large,
    "fifo": _fifo,
    "dev-zero": _dev_zero,
    "directory": _directory,
    "wrong-type": _wrong_type,
}


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A reader that blocks on a FIFO fails the test instead of hanging it."""

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError("a reader blocked (a FIFO read without a check?)")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run with a kept model and a tracker (TensorBoard)."""
    tmp = tmp_path_factory.mktemp("hostile")
    out = tmp / "run"
    args = [*tiny_cli_args(tmp, "fedavg"), "logger=[tensorboard]"]
    assert main(["run", *args, "--out", str(out)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run", symlinks=True))


def _replace(path: Path, kind: str, json: bool, limit: int) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    KINDS[kind](path, json, limit)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    line = exit_2(capsys, argv)
    assert line.startswith("osfl: error: "), line
    assert "Traceback" not in line and len(line) < 600, line
    return line


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_config_file(tmp_path, capsys, kind) -> None:
    path = tmp_path / "c.yaml"
    KINDS[kind](path, False, 1 << 20)
    line = _refused(capsys, ["config", "show", str(path)])
    assert str(path) in line


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_base_file(tmp_path, capsys, kind) -> None:
    KINDS[kind](tmp_path / "base.yaml", False, 1 << 20)
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\ntrain: {epochs: 1}\n")
    line = _refused(capsys, ["config", "show", str(child)])
    assert "base.yaml" in line


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_saved_split(tmp_path, capsys, kind) -> None:
    path = tmp_path / "p.json"
    KINDS[kind](path, True, 256 << 20)
    args = [*tiny_cli_args(tmp_path, "fedavg"), f"partition.from_file={path}"]
    line = _refused(capsys, ["run", *args, "--out", str(tmp_path / "out")])
    assert str(path) in line
    assert not (tmp_path / "out").exists()  # refused while planning


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_tracker_ids_on_resume(run, tmp_path, capsys, kind) -> None:
    d = _copy(run, tmp_path)
    _replace(d / "trackers.json", kind, True, 64 << 10)
    before = (d / "metrics.json").read_bytes()
    line = _refused(capsys, ["run", "--resume", str(d), "--no-progress"])
    assert "trackers.json" in line
    assert (d / "metrics.json").read_bytes() == before  # nothing lost


@pytest.mark.parametrize("name", ["card.json", "state.safetensors", "model.safetensors"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_kept_model_file(run, tmp_path, capsys, kind, name) -> None:
    d = _copy(run, tmp_path)
    _replace(d / "models" / "fedavg-seed0" / name, kind, name.endswith(".json"), 16 << 30)
    line = _refused(capsys, ["eval", str(d)])
    assert name in line or "models/fedavg-seed0" in line, line


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_metrics_file_under_eval(run, tmp_path, capsys, kind) -> None:
    d = _copy(run, tmp_path)
    _replace(d / "metrics.json", kind, True, 256 << 20)
    assert "metrics.json" in _refused(capsys, ["eval", str(d)])


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_event_log_under_flower_status(run, tmp_path, capsys, kind) -> None:
    d = _copy(run, tmp_path)
    _replace(d / "events.jsonl", kind, True, 512 << 20)
    assert "events.jsonl" in _refused(capsys, ["flower", "status", str(d)])


def test_the_run_itself_is_fine(run, capsys) -> None:
    """The control: the same commands on the untouched run succeed."""
    assert main(["eval", str(run)]) == 0
    assert main(["flower", "status", str(run)]) == 0
