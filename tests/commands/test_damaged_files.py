"""Damaged files never give a traceback (issue: "no traceback from a damaged
file"): seeded fuzzing of a recorded run directory (truncations, bit flips,
wrong JSON types, JSON nested thousands of levels deep, deleted and garbage
files) under ``osfl audit``, ``osfl table`` and ``osfl run --resume``, and of
checkpoints under ``read_state_dict``. Each case
ends with exit 0 or one ``osfl: error:`` line and exit 2; the slow variants
run many more cases."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from osfl.cli import main
from osfl.errors import ConfigError
from osfl.models.weights import read_state_dict
from support.tiny import TINY_SCAFFOLD

RUN = [*TINY_SCAFFOLD, "train.epochs=1", "audit=[llg+]"]
WRONG_TYPES: list[Any] = ["x", -1, None, [], {}, 1e308, True, {"a": [1]}, 10**30]


def _json_paths(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for k, v in items:
        yield from _json_paths(v, (*path, k))


def damage(root: Path, rng: random.Random) -> str:
    """Damage one file of ``root`` in one way; returns what was done."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".png")
    f = rng.choice(files)
    data = f.read_bytes()
    kind = rng.choice(["truncate", "flip", "json", "json", "deep", "delete", "garbage"])
    if kind == "deep" and f.suffix in (".json", ".jsonl"):  # json.loads recurses per level
        text = data.decode(errors="replace")
        cut = rng.randrange(max(len(text), 1))
        f.write_text(text[:cut] + "[" * 5000 + "]" * 5000 + text[cut:])
        return f"deep nesting in {f.relative_to(root)}"
    if kind == "json" and f.suffix == ".json":
        obj = json.loads(data)
        paths = [p for p in _json_paths(obj) if p]
        if paths:
            where = rng.choice(paths)
            parent = obj
            for k in where[:-1]:
                parent = parent[k]
            parent[where[-1]] = rng.choice(WRONG_TYPES)
        else:
            obj = rng.choice(WRONG_TYPES)
        f.write_text(json.dumps(obj))
        return f"wrong type in {f.relative_to(root)}"
    if kind in ("truncate", "json", "deep"):
        f.write_bytes(data[: rng.randrange(max(len(data), 1))])
    elif kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        f.write_bytes(bytes(b))
    elif kind == "delete":
        f.unlink()
    else:
        f.write_bytes(rng.randbytes(rng.randint(0, 64)))
    return f"{kind} {f.relative_to(root)}"


def cli(args: list[str]) -> tuple[int, str]:
    """Exit status and stderr of ``osfl ARGS`` run in this process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(args)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, err.getvalue()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "r"
    code, err = cli(["run", *RUN, "--out", str(out), "--no-progress"])
    assert code == 0, err
    return out


def _fuzz_run_dir(recorded: Path, tmp_path: Path, cases: range) -> None:
    for i in cases:
        rng = random.Random(i)
        d = tmp_path / f"m{i}"
        shutil.copytree(recorded, d)
        what = damage(d, rng)
        command = rng.choice(
            [
                ["audit", str(d), "--attack", "zlg+", "--aux-per-class", "2"],
                ["table", str(d)],
                ["run", "--resume", str(d), "--no-progress"],
            ]
        )
        code, err = cli(command)
        assert "Traceback" not in err, f"case {i} ({what}): {err}"
        assert code in (0, 2), f"case {i} ({what}): exit {code}: {err}"
        if code == 2:
            lines = [line for line in err.splitlines() if line.startswith("osfl: error:")]
            assert len(lines) == 1, f"case {i} ({what}): {err}"
        shutil.rmtree(d)


def test_a_damaged_run_directory_gives_one_line_not_a_traceback(recorded, tmp_path) -> None:
    _fuzz_run_dir(recorded, tmp_path, range(12))


@pytest.mark.slow
def test_many_damaged_run_directories(recorded, tmp_path) -> None:
    _fuzz_run_dir(recorded, tmp_path, range(12, 300))


def test_missing_observations_are_counted(recorded, tmp_path) -> None:
    d = tmp_path / "r"
    shutil.copytree(recorded, d)
    next(d.rglob("client_001/observation.json")).unlink()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        assert main(["audit", str(d), "--attack", "zlg+", "--aux-per-class", "2"]) == 0
    assert "1 of 6" in " ".join(err.getvalue().split())


def _checkpoints(tmp_path: Path) -> list[Path]:
    from safetensors.torch import save_file

    state = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)).state_dict()
    st, pth = tmp_path / "w.safetensors", tmp_path / "w.pth"
    save_file({k: v.contiguous() for k, v in state.items()}, str(st))
    torch.save({"model": state, "epoch": 3}, str(pth))
    return [st, pth]


def _fuzz_checkpoints(tmp_path: Path, cases: range) -> None:
    originals = {p: p.read_bytes() for p in _checkpoints(tmp_path)}
    for i in cases:
        rng = random.Random(i)
        for path, data in originals.items():
            path.write_bytes(data)
            b = bytearray(data)
            mode = rng.choice(["truncate", "flip", "garbage"])
            if mode == "truncate":
                b = b[: rng.randrange(len(b))]
            elif mode == "flip":
                for _ in range(rng.randint(1, 16)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            else:
                b = bytearray(rng.randbytes(rng.randint(0, 256)))
            path.write_bytes(bytes(b))
            try:
                read_state_dict(path)
            except ConfigError as e:
                assert str(path) in str(e), f"case {i} ({mode}): {e}"
    for path, data in originals.items():  # and the intact files still load
        path.write_bytes(data)
        assert len(read_state_dict(path)) == 9


def test_a_damaged_checkpoint_is_one_config_error(tmp_path) -> None:
    _fuzz_checkpoints(tmp_path, range(100))


@pytest.mark.slow
def test_many_damaged_checkpoints(tmp_path) -> None:
    _fuzz_checkpoints(tmp_path, range(100, 2000))


def test_a_checkpoint_with_nan_weights_is_refused(tmp_path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "nan.safetensors"
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(path))
    with pytest.raises(ConfigError, match="'w' holds NaN"):
        read_state_dict(path)
