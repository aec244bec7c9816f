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
