"""The CPU kernel fingerprint: what decides the last bits of a CPU result.

On a CPU, torch's float32 training reaches three kernel libraries, and each
picks its code path from the machine: ATen's vectorised kernels by torch's
CPU capability (``ATEN_CPU_CAPABILITY`` caps it), oneDNN's convolutions by
the instruction set it detects (``ONEDNN_MAX_CPU_ISA`` caps it) and by the
caches it blocks for, MKL's GEMMs by its code branch (``MKL_CBWR`` pins it,
otherwise chosen by the CPU's vendor and flags). Each path sums in its own
order, and after thirty epochs of training the last bits become the last
digits of an accuracy: measured on the default run, FedAvg moves 3.3 points
and FAFI 4.9 across the kernel paths of one machine (REPRODUCTION.md, "How
much the machine moves a number"). ``torch 2.13.0+cpu, cpu AVX512`` names none of
this, so two machines with that label gave different numbers (issue "The
README's two commands pass on any clean machine").

The pinning variables are recorded as set, not as obeyed: MKL ignores a
branch the CPU's vendor does not support (``MKL_CBWR=AVX2`` on an AMD CPU
runs MKL's AUTO branch, issue 55), and the fingerprint cannot tell, so
``OSFL_CPU_KERNELS=portable`` pins the COMPATIBLE branch, which MKL runs on
every x86-64 vendor (``benchmarks/kernel_probe.py`` reads back the branch
MKL took).

:func:`cpu_fingerprint` records every input of that choice that a process
can read: torch's build and capability, oneDNN's ISA *as it runs* (read
from oneDNN's own verbose line, so a cap in the environment shows), whether
torch routes convolutions to oneDNN, the pinning variables in force, the
CPU's vendor, model, caches and the flags the libraries dispatch on (AVX2,
AVX-512 and its VNNI / BF16 / FP16 extensions, AMX). Two runs of one config
with equal fingerprints and thread counts give identical numbers; the doc
checker compares documented numbers exactly only where the fingerprint it
recorded equals the machine's (``scripts/check_docs.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from osfl.errors import ConfigError

__all__ = [
    "CPU_KERNEL_CHOICES",
    "KERNEL_ENV",
    "KERNEL_FLAGS",
    "cpu_fingerprint",
    "fingerprint_id",
    "fingerprint_text",
]

#: CPU flags (as /proc/cpuinfo spells them) that ATen, oneDNN or MKL dispatch on.
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
#: Environment variables that cap or pin those libraries' code paths.
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DEBUG_CPU_TYPE",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "OSFL_CPU_KERNELS",
)
#: The values ``OSFL_CPU_KERNELS`` takes (``osfl/__init__.py``).
CPU_KERNEL_CHOICES = ("native", "portable")
#: oneDNN's own names of its ISAs (its verbose line) → its ``ONEDNN_MAX_CPU_ISA`` names.
_ONEDNN_ISAS = {
    "Intel SSE4.1": "sse41",
    "Intel AVX": "avx",
    "Intel AVX2": "avx2",
    "Intel AVX2 with Intel DL Boost": "avx2_vnni",
    "Intel AVX2 with Intel DL Boost and bfloat16 support": "avx2_vnni_2",
    "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions": "avx512_core",
    "Intel AVX-512 with Intel DL Boost": "avx512_core_vnni",
    "Intel AVX-512 with Intel DL Boost and bfloat16 support": "avx512_core_bf16",
    "Intel AVX-512 with float16, Intel DL Boost and bfloat16 support": "avx512_core_fp16",
}
_AMX = "Intel AMX"
_probe_lock = threading.Lock()
if os.environ.get("OSFL_CPU_KERNELS") == "portable":
    # the third pin of the portable kernels (osfl/__init__.py has the other two):
    # ATen's own convolution, whose GEMMs are MKL's pinned COMPATIBLE branch
    torch.backends.mkldnn.enabled = False
_probed: dict[str, str | None] = {}


def onednn_isa() -> str | None:
    """The ISA oneDNN dispatches to in this process (``avx512_core_bf16``,
    ``avx2``, ...), read from its verbose line while it runs one small
    convolution; ``None`` where torch has no oneDNN or it printed nothing.

    oneDNN prints that line to the process's standard output once, so the
    probe redirects file descriptor 1 for the few milliseconds it takes, and
    runs once per process (the answer cannot change after oneDNN started)."""
    with _probe_lock:
        if "isa" not in _probed:
            _probed["isa"] = _probe_onednn() if torch.backends.mkldnn.is_available() else None
        return _probed["isa"]


def _probe_onednn() -> str | None:
    sys.stdout.flush()
    fd, path = tempfile.mkstemp(prefix="osfl-onednn-")
    saved = os.dup(1)
    try:
        os.dup2(fd, 1)
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            # large enough for torch to route it to oneDNN (small ones take ATen's path)
            torch.nn.functional.conv2d(torch.ones(2, 16, 32, 32), torch.ones(16, 16, 3, 3))
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)
        text = Path(path).read_text(errors="replace")
        Path(path).unlink()
    for line in text.splitlines():
        if ",cpu,isa:" in line:
            name = line.split(",cpu,isa:", 1)[1].strip()
            if _AMX in name:
                return "avx512_core_amx" + ("_fp16" if "float16" in name else "")
            return _ONEDNN_ISAS.get(name, name)
    return None


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty off Linux); read
    once per process: every client's cache key asks for the fingerprint."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends here
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


@functools.cache
def _caches() -> str:
    """The data and unified caches of CPU 0 (``L1d 48K L2 1024K L3 32768K``):
    oneDNN and MKL size their blocks by them."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    parts = []
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = (index / "level").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            parts.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return " ".join(parts)


def check_kernel_choice() -> None:
    """Refuse an ``OSFL_CPU_KERNELS`` value osfl does not know (a typo would
    otherwise run the native kernels while the user believes them pinned)."""
    value = os.environ.get("OSFL_CPU_KERNELS", "native") or "native"
    if value not in CPU_KERNEL_CHOICES:
        raise ConfigError(
            f"OSFL_CPU_KERNELS={value[:40]!r}: use one of {', '.join(CPU_KERNEL_CHOICES)}"
        )


def cpu_fingerprint() -> dict[str, Any]:
    """What decides the CPU kernels of this process (module docstring)."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "torch": torch.__version__,
        "aten": torch.backends.cpu.get_cpu_capability(),
        "onednn_isa": onednn_isa(),
        "onednn_conv": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        "env": {k: os.environ[k] for k in KERNEL_ENV if os.environ.get(k)},
        "cpu": info.get("model name", ""),
        "vendor": info.get("vendor_id", ""),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
        "caches": _caches(),
    }


def fingerprint_id(fingerprint: dict[str, Any]) -> str:
    """A short stable hash of a fingerprint (12 hex digits)."""
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def fingerprint_text(fingerprint: dict[str, Any]) -> str:
    """One line for a reader: ``torch 2.13.0+cpu, aten AVX512, oneDNN
    avx512_core_bf16, AMD EPYC, fingerprint 1a2b3c4d5e6f`` (the hash covers
    the flags, caches and pinning variables the line leaves out)."""
    fp = fingerprint
    pins = " ".join(f"{k}={v}" for k, v in sorted(fp["env"].items()))
    conv = "" if fp["onednn_conv"] else " (convolutions off oneDNN)"
    return (
        f"torch {fp['torch']}, aten {fp['aten']}, oneDNN {fp['onednn_isa']}{conv}, "
        f"{fp['cpu'] or 'unknown CPU'}{', ' + pins if pins else ''}, "
        f"fingerprint {fingerprint_id(fp)}"
    )
