"""``train_clients``: a run's clients trained over several commands into one
client cache, the last, full run finding them all there (issue #40)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from osfl.cli import main
from osfl.config import load_config
from osfl.errors import ConfigError
from support.smoke import tiny_cli_args


def _run(tmp_path: Path, out: str, cache: str, *extra: str) -> dict[str, dict[str, Any]]:
    """``osfl run`` of FAFI (SALT clients) and FedAvg (CE clients) on three
    8-px digit clients; the records by method."""
    args = [
        *tiny_cli_args(tmp_path, "fedavg,fafi"),
        "partition.num_clients=3",
        "method.fafi={augment: flip}",
        f"cache_dir={tmp_path / cache}",
        *extra,
    ]
    assert main(["run", *args, "--out", str(tmp_path / out)]) == 0
    records = json.loads((tmp_path / out / "metrics.json").read_text())["records"]
    return {r["method"]: r for r in records}


def test_clients_trained_in_parts_give_the_full_runs_record(tmp_path: Path, capsys) -> None:
    """Clients 0, then 1 and 2, into one cache: each part trains only its
    clients and states that no accuracy was computed; the full run then
    trains nothing (every client a cache hit) and gives exactly the record
    accuracy of a full run from an empty cache."""
    first = _run(tmp_path, "p0", "shared", "train_clients=[0]")
    second = _run(tmp_path, "p12", "shared", "train_clients=[1,2]")
    for part, ids in ((first, [0]), (second, [1, 2])):
        for r in part.values():
            assert r["global_test_accuracy"] is None and r["trained_clients"] == ids
            assert r["cache"] == {"hits": 0, "misses": len(ids)}
            assert any(w.startswith(f"train_clients: trained and cached clients {ids} only")
                       for w in r["warnings"])  # fmt: skip
    events = (tmp_path / "p0" / "events.jsonl").read_text().splitlines()
    ends = [json.loads(e) for e in events if '"method_end"' in e]
    assert [e["trained_clients"] for e in ends] == [[0], [0]]

    full = _run(tmp_path, "full", "shared")
    fresh = _run(tmp_path, "fresh", "empty")
    for method in ("fedavg", "fafi"):
        assert full[method]["cache"] == {"hits": 3, "misses": 0}
        assert fresh[method]["cache"] == {"hits": 0, "misses": 3}
        acc = full[method]["global_test_accuracy"]
        assert acc is not None and acc == fresh[method]["global_test_accuracy"]
        assert "trained_clients" not in full[method]
    # a part's table shows no accuracy, never a made-up one
    capsys.readouterr()
    assert main(["table", str(tmp_path / "p0")]) == 0
    shown = capsys.readouterr().out
    assert "nan" not in shown.lower() and "trained and cached clients [0] only" in shown


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("[3]", "train_clients must list client ids in 0..2"),
        ("[-1]", "train_clients must list client ids in 0..2"),
        ("[]", "train_clients must list client ids"),
    ],
)
def test_train_clients_must_name_clients_of_the_federation(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"train_clients must list") as e:
        load_config(None, ["partition.num_clients=3", f"train_clients={value}"])
    assert why in str(e.value)


def test_a_bad_train_clients_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    args = [*tiny_cli_args(tmp_path), "train_clients=[5]", "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as e:
        main(["run", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_clients must list client ids in 0..1" in err[0], err
    with pytest.raises(ConfigError, match="set cache_dir"):
        load_config(None, ["train_clients=[0]", "cache_dir=null"])
    with pytest.raises(ConfigError, match="no uploads to audit"):
        load_config(None, ["train_clients=[0]", "audit=[rlu]"])
    with pytest.raises(ConfigError, match=r"write train_clients=\[0,1\]"):
        load_config(None, ["train_clients=0"])
    with pytest.raises(SystemExit):  # refused before any client trains
        _run(tmp_path, "multi", "c", "train_clients=[0]", "method.fedavg={rounds: 2}")
    assert "one-shot clients; fedavg runs 2 rounds" in capsys.readouterr().err
