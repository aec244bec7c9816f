"""``partition.from_file``: a split written by ``osfl partition`` is reused
as it is, and refused in one line when it was made on other data or for
another number of clients (osfl.data.saved_split)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfl.assembly import build_federation, load_splits
from osfl.cli import main
from osfl.config import load_config
from osfl.errors import ConfigError, DataError

TASK = ["data.max_per_class=20", "partition.min_partition_size=2"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("split") / "p.json"
    argv = ["partition", "--dataset", "digits", "--scheme", "dirichlet", "--alpha", "0.5"]
    assert main([*argv, "--clients", "4", "--seed", "7", "--out", str(out)]) == 0
    return out


def test_the_saved_split_is_the_run_s_for_every_seed(saved: Path) -> None:
    """`osfl partition` used the whole digits train set; the run reads the same
    set, so it gets exactly the saved clients, whatever the run's seed."""
    cfg = load_config(None, ["partition.num_clients=4", f"partition.from_file={saved}"])
    train = load_splits(cfg).train
    doc = json.loads(saved.read_text())
    for seed in (0, 1):
        fed = build_federation(cfg, train, seed)
        assert [a.tolist() for a in fed.client_indices] == doc["client_indices"]
        assert fed.key() == doc["key"]


def test_a_split_of_other_data_or_clients_is_refused(saved: Path) -> None:
    cfg = load_config(None, [*TASK, "partition.num_clients=4", f"partition.from_file={saved}"])
    with pytest.raises(DataError, match="made on another train set"):
        build_federation(cfg, load_splits(cfg).train, 0)
    cfg = load_config(None, ["partition.num_clients=5", f"partition.from_file={saved}"])
    with pytest.raises(ConfigError, match=r"holds 4 clients; set partition\.num_clients=4"):
        build_federation(cfg, load_splits(cfg).train, 0)


def test_a_damaged_split_file_is_one_error(saved: Path, tmp_path: Path) -> None:
    doc = json.loads(saved.read_text())
    doc["client_indices"][0] = [-1, *doc["client_indices"][0][1:]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    cfg = load_config(None, ["partition.num_clients=4", f"partition.from_file={bad}"])
    with pytest.raises(DataError):
        build_federation(cfg, load_splits(cfg).train, 0)
