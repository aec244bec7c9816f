"""Every record says what made its numbers (issue "Numbers that reproduce"):
the environment the clients trained in and fingerprints of the data and the
pretrained weights."""

from __future__ import annotations

import torch

from osfl import assembly
from osfl.config import load_config
from osfl.experiment import run_experiment
from osfl.fl.provenance import compute_environment

TINY = [
    "data.image_size=8",
    "data.max_per_class=10",
    "partition.num_clients=2",
    "train.epochs=1",
    "methods=[fedavg]",
    "threads_per_client=1",
    "cache_dir=null",
    "progress=false",
]


def test_a_record_states_its_provenance() -> None:
    cfg = load_config(None, TINY)
    (record,) = run_experiment(cfg)
    splits = assembly.load_splits(cfg)
    prov = record["provenance"]
    assert prov["torch"] == torch.__version__
    assert prov["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert prov["device"] == "cpu" and prov["threads_per_client"] == 1
    assert prov["data"] == {
        "source": "digits",
        "train": splits.train.fingerprint(),
        "test": splits.test.fingerprint(),
    }
    assert prov["pretrained_sha256"] is None


def test_the_environment_names_the_threads_in_force() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert compute_environment()["threads"] == 1
    finally:
        torch.set_num_threads(before)
    assert "gpu" not in compute_environment("cpu")


def test_the_default_uses_every_cpu_and_the_numbers_do_not_move(monkeypatch) -> None:
    """``parallel_clients: auto`` (one single-threaded client per usable CPU)
    gives the sequential run's numbers bit for bit: no setting that changes
    results is chosen by the machine or its load."""
    monkeypatch.setattr(assembly, "usable_cpus", lambda: 3)
    both = [*TINY, "partition.num_clients=3", "methods=[local,fedavg,ensemble]"]
    auto = run_experiment(load_config(None, [*both, "parallel_clients=auto"]))
    one = run_experiment(load_config(None, [*both, "parallel_clients=1"]))
    assert [r["parallel_clients"] for r in auto] == [3, 3, 3]
    assert [r["parallel_clients"] for r in one] == [1, 1, 1]
    for a, b in zip(auto, one, strict=True):
        assert a["global_test_accuracy"] == b["global_test_accuracy"], a["method"]
        assert a["per_class_accuracy"] == b["per_class_accuracy"], a["method"]
