"""Every record says what made its numbers (issue "Numbers that reproduce"):
the environment the clients trained in and fingerprints of the data and the
pretrained weights."""

from __future__ import annotations

import torch

from osfl import assembly, run_record
from osfl.config import load_config
from osfl.experiment import run_experiment
from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id
from osfl.fl.provenance import compute_environment
from support.tiny import TINY_PROVENANCE


def test_a_record_states_its_provenance() -> None:
    cfg = load_config(None, TINY_PROVENANCE)
    (record,) = run_experiment(cfg)
    splits = assembly.load_splits(cfg)
    prov = record["provenance"]
    assert prov["torch"] == torch.__version__
    assert prov["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert prov["cpu_fingerprint"] == fingerprint_id(cpu_fingerprint())  # what predicts equality
    assert prov["cpu_kernels"]["onednn_isa"] == cpu_fingerprint()["onednn_isa"]
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
    both = [*TINY_PROVENANCE, "partition.num_clients=3", "methods=[local,fedavg,ensemble]"]
    auto = run_experiment(load_config(None, [*both, "parallel_clients=auto"]))
    one = run_experiment(load_config(None, [*both, "parallel_clients=1"]))
    assert [r["parallel_clients"] for r in auto] == [3, 3, 3]
    assert [r["parallel_clients"] for r in one] == [1, 1, 1]
    for a, b in zip(auto, one, strict=True):
        assert a["global_test_accuracy"] == b["global_test_accuracy"], a["method"]
        for key in ("per_class_accuracy", "mean_client_per_class_accuracy"):  # local: the clients'
            assert a.extra(key) == b.extra(key), (a.method, key)


def _fake_gpu(monkeypatch, *, bf16: bool = True) -> None:
    """torch.cuda as an H100 would answer it (no GPU here: issue #32's records
    must carry their machine, and the path is tested without one)."""
    import sys
    import types

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlSystemGetDriverVersion=lambda: "570.86.15"
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_a_gpu_environment_names_the_gpu_driver_and_build(monkeypatch) -> None:
    _fake_gpu(monkeypatch)
    env = compute_environment("cuda")
    assert env["device"] == "cuda"
    assert env["gpu"] == "NVIDIA H100 80GB HBM3" and env["gpu_capability"] == "9.0"
    assert env["cuda"] == "12.8" and env["cudnn"] == 90100
    assert env["cuda_driver"] == "570.86.15"
    assert env["torch"] == torch.__version__ and env["torch_git"] == torch.version.git_version


def test_the_compute_dtype_follows_amp_and_the_gpu(monkeypatch) -> None:
    from osfl.fl.provenance import compute_dtype

    assert compute_dtype("cpu", amp=True) == "float32"  # no autocast on a CPU
    _fake_gpu(monkeypatch, bf16=True)
    assert compute_dtype("cuda", amp=True) == "bfloat16"
    assert compute_dtype("cuda", amp=False) == "float32"
    _fake_gpu(monkeypatch, bf16=False)
    assert compute_dtype("cuda:0", amp=True) == "float16"


def test_a_gpu_record_carries_its_machine(monkeypatch) -> None:
    """The record's provenance on a (faked) GPU: the run itself stays on the CPU
    (nothing here can compute on CUDA), only what it reports is the GPU's."""
    import dataclasses

    _fake_gpu(monkeypatch)
    cfg = load_config(None, [*TINY_PROVENANCE, "train.amp=true"])
    splits = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, splits, 0)
    job = assembly.build_job(cfg, "fedavg", ctx)
    job = dataclasses.replace(job, run=dataclasses.replace(job.run, device=torch.device("cuda")))
    prov = run_record.record_provenance(cfg, job, ctx, None)
    assert prov["gpu"] == "NVIDIA H100 80GB HBM3" and prov["cuda_driver"] == "570.86.15"
    assert prov["dtype"] == "bfloat16" and prov["device"] == "cuda"
    assert "threads" not in prov  # the record's threads are threads_per_client
    (record,) = run_experiment(cfg)  # on the CPU: float32 whatever train.amp says
    assert record["provenance"]["dtype"] == "float32" and "gpu" not in record["provenance"]
