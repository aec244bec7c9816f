"""``logger=[wandb]`` (osfl.trackers.wandb): what a tiny ``osfl run`` hands
W&B, seen twice. A stand-in ``wandb`` module records every call (runs
everywhere); where wandb is installed, a real offline run's ``.wandb`` file is
read back record by record."""

from __future__ import annotations

import importlib.machinery
import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from support.tracked_run import records_by_method, resume_without_local, run_with_logger


class FakeRun:
    """What osfl calls on a ``wandb.Run``, recorded."""

    def __init__(self, **init: Any) -> None:
        self.init, self.id = init, init["id"] or "fake0001"
        self.logged: list[dict[str, Any]] = []
        self.metrics: list[tuple[str, str | None]] = []
        self.summary: dict[str, float] = {}
        self.exit_code: int | None = None

    def define_metric(self, name: str, step_metric: str | None = None, **_: Any) -> None:
        self.metrics.append((name, step_metric))

    def log(self, data: dict[str, Any]) -> None:
        self.logged.append(data)

    def finish(self, exit_code: int | None = None) -> None:
        self.exit_code = exit_code


class FakeTable:
    def __init__(self, columns: list[str], data: list[list[str]]) -> None:
        self.columns, self.data = columns, data


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    """A ``wandb`` module that records its runs (the list returned)."""
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    module.init = init  # type: ignore[attr-defined]
    module.Table = FakeTable  # type: ignore[attr-defined]
    module.Settings = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return runs


def test_one_wandb_run_gets_the_config_rounds_finals_and_table(
    tmp_path: Path, fake_wandb: list[FakeRun]
) -> None:
    out = run_with_logger(tmp_path, "wandb")
    [run] = fake_wandb
    doc = json.loads((out / "metrics.json").read_text())
    assert run.init == {
        "project": "osfl",
        "name": "default",
        "dir": str(out),
        "config": doc["config"],
        "mode": "offline",
        "id": None,
        "resume": None,
        "settings": {"console": "off"},
    }
    assert run.metrics == [("fedavg/seed0/round", None), ("fedavg/seed0/*", "fedavg/seed0/round")]
    fedavg, local = doc["records"][0], doc["records"][1]
    *rounds, last = run.logged
    assert [(r["fedavg/seed0/round"], r["fedavg/seed0/accuracy"]) for r in rounds] == [
        (p["round"], p["global_test_accuracy"]) for p in fedavg["curve"]
    ]
    assert rounds[0]["fedavg/seed0/bytes_up"] == fedavg["bytes_up"] / 3  # each round's own
    assert run.summary["fedavg/seed0/final/accuracy"] == fedavg["global_test_accuracy"]
    assert run.summary["local/seed0/final/accuracy"] == local["mean_client_accuracy"]
    table = last["summary_table"]
    assert table.columns[:3] == ["method", "seeds", "accuracy (%)"]
    summary = (out / "summary.md").read_text()
    assert [row[0] for row in table.data] == ["fedavg", "local"]
    assert all("| " + " | ".join(row) + " |" in summary for row in table.data)
    assert run.exit_code == 0
    assert json.loads((out / "trackers.json").read_text()) == {"wandb": "fake0001"}

    resume_without_local(tmp_path, "wandb", out)
    resumed = fake_wandb[1]
    assert (resumed.init["id"], resumed.init["resume"]) == ("fake0001", "allow")
    assert not any("fedavg/seed0/round" in data for data in resumed.logged)  # finished before
    assert list(resumed.summary) == [f"local/seed0/final/{k}" for k in _LOCAL_FINALS]


_LOCAL_FINALS = ("accuracy", "mean_client_accuracy", "bytes_up", "bytes_down", "time_s")


# ---- a real offline run, read back from its .wandb file


def wandbrecords_by_method(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B's LevelDB-log framing (32 KiB
    blocks; each chunk a 7-byte header: CRC32, length, type full / first /
    middle / last) after a 7-byte ``:W&B`` file header."""
    data, pos, out, part = path.read_bytes(), 7, [], b""
    block = 32 * 1024
    while pos < len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            out.append(part + chunk)
    return out


def _key(item: Any) -> str:
    """An item's key: W&B stores a key with ``/`` as its nested parts."""
    return item.key or "/".join(item.nested_key)


def _history_and_summary(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    [path] = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history, summary = [], {}
    for raw in wandbrecords_by_method(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return history, summary


def test_an_offline_run_holds_the_records_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    out = run_with_logger(tmp_path, "wandb")
    records = records_by_method(out)
    history, summary = _history_and_summary(out)
    rounds = [h for h in history if "fedavg/seed0/accuracy" in h]
    assert [(h["fedavg/seed0/round"], h["fedavg/seed0/accuracy"]) for h in rounds] == [
        (p["round"], p["global_test_accuracy"]) for p in records["fedavg"]["curve"]
    ]
    assert summary["fedavg/seed0/final/accuracy"] == records["fedavg"]["global_test_accuracy"]
    assert summary["local/seed0/final/accuracy"] == records["local"]["mean_client_accuracy"]
    run_id = json.loads((out / "trackers.json").read_text())["wandb"]
    [table] = (out / "wandb").glob(f"offline-run-*-{run_id}/files/media/table/*.table.json")
    rows = json.loads(table.read_text())
    assert [row[0] for row in rows["data"]] == ["fedavg", "local"]
    summary_md = (out / "summary.md").read_text()
    assert all("| " + " | ".join(row) + " |" in summary_md for row in rows["data"])
