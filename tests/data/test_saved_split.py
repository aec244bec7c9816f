"""``partition.from_file``: a split written by ``osfl partition`` is reused
as it is, and refused in one line when it was made on other data or for
another number of clients (osfl.data.saved_split)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from osfl.assembly import build_federation, load_splits
from osfl.cli import main
from osfl.config import load_config
from osfl.data.federation import Federation
from osfl.errors import ConfigError, DataError
from support.tiny import TINY_SAVED_SPLIT


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
    cfg = load_config(
        None, [*TINY_SAVED_SPLIT, "partition.num_clients=4", f"partition.from_file={saved}"]
    )
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


# --------------------------------------------------------------------------- issue 51
def _load(path: Path, *extra: str):
    cfg = load_config(None, ["partition.num_clients=4", f"partition.from_file={path}", *extra])
    return build_federation(cfg, load_splits(cfg).train, 0)


def _swap_two(doc: dict, labels: np.ndarray) -> dict:
    """``doc`` with one index of client 0 and one of client 1 (of other
    classes) exchanged: still a valid-looking split, sorted and disjoint."""
    a, b = doc["client_indices"][0], doc["client_indices"][1]
    i = next(x for x in a if any(labels[y] != labels[x] for y in b))
    j = next(y for y in b if labels[y] != labels[i])
    a[a.index(i)], b[b.index(j)] = j, i
    a.sort()
    b.sort()
    return doc


def test_the_key_covers_every_index(saved: Path, tmp_path: Path) -> None:
    """An index exchanged between two clients changes the key (format 2), so
    the file no longer matches its stored key; a forger who recomputes the
    key then meets the class counts, checked against the labels."""
    cfg = load_config(None, ["partition.num_clients=4", f"partition.from_file={saved}"])
    labels = load_splits(cfg).train.labels.numpy()
    doc = _swap_two(json.loads(saved.read_text()), labels)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="stored key does not match its content"):
        _load(edited)
    original = Federation.from_dict(json.loads(saved.read_text()))
    moved = Federation(  # the same edit with a key recomputed to match
        original.scheme,
        original.params,
        original.seed,
        original.num_clients,
        original.num_classes,
        original.num_samples,
        original.data_fingerprint,
        tuple(np.array(a) for a in doc["client_indices"]),
        original.class_counts,
    )
    assert moved.key() != original.key() and moved.recipe_key() == original.recipe_key()
    edited.write_text(json.dumps(moved.to_dict()))
    with pytest.raises(DataError, match="client 0's class_counts are not the classes of its"):
        _load(edited)


def test_reversed_class_counts_are_refused_even_with_a_fresh_key(saved, tmp_path) -> None:
    fed = Federation.from_dict(json.loads(saved.read_text()))
    flipped = Federation(
        fed.scheme,
        fed.params,
        fed.seed,
        fed.num_clients,
        fed.num_classes,
        fed.num_samples,
        fed.data_fingerprint,
        fed.client_indices,
        fed.class_counts[:, ::-1],
    )
    path = tmp_path / "flipped.json"
    path.write_text(json.dumps(flipped.to_dict()))
    with pytest.raises(DataError, match="class_counts are not the classes of its indices"):
        _load(path)


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("partition.scheme=iid", "partition.scheme=iid beside partition.from_file="),
        ("partition.alpha=0.3", "partition.alpha=0.3 beside"),
        ("partition.seed=3", "partition.seed=3 beside"),
        ("partition.options={self_balancing: true}", "partition.options.self_balancing=True"),
    ],
)
def test_an_option_the_file_overrides_is_refused_not_ignored(saved, option, says) -> None:
    with pytest.raises(ConfigError) as e:
        _load(saved, option)
    assert says in str(e.value) and "a saved dirichlet split (alpha 0.5" in str(e.value)
    assert "drop partition." in str(e.value)


def test_options_left_at_a_default_or_equal_to_the_file_are_accepted(saved) -> None:
    # the packaged default's alpha (0.1) and min_partition_size (10), untouched
    assert _load(saved).key() == json.loads(saved.read_text())["key"]
    assert _load(saved, "partition.alpha=0.5", "partition.seed=7").num_clients == 4
    assert _load(saved, "partition.scheme=DIRICHLET").scheme == "dirichlet"


def test_a_format_1_file_is_refused_with_its_reason(saved, tmp_path) -> None:
    doc = json.loads(saved.read_text())
    doc["version"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"older osfl \(format 1, whose key does not cover"):
        _load(old)
