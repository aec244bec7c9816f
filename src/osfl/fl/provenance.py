"""What a number was computed with, besides the code, the config and the seed.

On a CPU, torch's reductions sum in an order set by the kernel paths it
dispatches to (ATen's capability, oneDNN's ISA, MKL's branch: the CPU
fingerprint of :mod:`osfl.fl.fingerprint`) and by the thread count (a
reduction is split per thread), so one command gives results that differ in
the last bits, and after training in the last digits of an accuracy, across
these; on a GPU the device, its driver and the torch build do the same. Every
client-cache entry is keyed on :func:`compute_environment` (weights trained
under other threads, kernels or torch are a miss, never a silent hit), and
every record states it (``provenance`` in ``metrics.json``).
"""

from __future__ import annotations

from typing import Any

import torch

from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id

__all__ = ["compute_dtype", "compute_environment"]


def compute_environment(device: torch.device | str = "cpu") -> dict[str, Any]:
    """The torch build, the CPU kernel path (ATen's capability, and the whole
    CPU fingerprint with its short id: ``cpu_fingerprint`` names the runs
    that give identical numbers), the torch threads in force now, and the
    device (on a GPU: its name and compute capability, the CUDA runtime and
    cuDNN torch was built with, torch's git commit, and the driver's version
    where NVML reports it)."""
    dev = torch.device(device)
    kernels = cpu_fingerprint()
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_fingerprint": fingerprint_id(kernels),
        "cpu_kernels": kernels,
        "threads": torch.get_num_threads(),
        "device": dev.type,
    }
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["torch_git"] = torch.version.git_version
        env["cuda_driver"] = _driver_version()
    return env


def compute_dtype(device: torch.device | str, amp: bool) -> str:
    """The dtype local training computes in: on a GPU with ``amp``, bfloat16
    where the GPU supports it, else float16 (with loss scaling); float32
    otherwise (osfl's training never autocasts on a CPU)."""
    if not (amp and torch.device(device).type == "cuda"):
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def _driver_version() -> str | None:
    """The NVIDIA driver's version (torch exposes it only through NVML)."""
    try:
        # optional: pynvml ships with CUDA builds of torch, not with the CPU build
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # no NVML: the record says so rather than failing the run
        return None
