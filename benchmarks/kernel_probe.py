"""Bitwise digests of the float32 kernels a CPU training step reaches (issue 55,
"Portable means portable, or the claim goes").

Whether ``OSFL_CPU_KERNELS=portable`` gives the same digits on two machines
is decided by the kernels it leaves running: MKL's SGEMM (under the MKL
branch ``MKL_CBWR`` pins), ATen's AVX2 kernels and ATen's own convolution
(im2col + SGEMM). This probe runs each of them on seeded inputs with one
thread and prints a SHA-256 of their output bytes, so two machines (or one
machine and an emulated CPU, ``qemu-x86_64 -cpu EPYC-Rome python ...``) are
compared in seconds instead of a whole default run:

- ``gemm_*``: ``a @ b`` at odd and at the default run's im2col shapes;
- ``conv_fwd`` / ``conv_bwd``: a 3×3 convolution and its input and weight
  gradients;
- ``step``: ``cnn_small`` (the default run's model, 3 input channels,
  16 px) after five SGD-with-momentum steps at the default recipe (lr
  0.05, momentum 0.9, weight decay 5e-4, batch 32), and its five losses.

Equal digests mean equal bits for these inputs; they are evidence for the
whole run, not proof (another shape may take another kernel). Run it as::

    OSFL_CPU_KERNELS=portable python benchmarks/kernel_probe.py
    MKL_VERBOSE=1 OSFL_CPU_KERNELS=portable python benchmarks/kernel_probe.py  # MKL's branch too
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path

import osfl  # noqa: F401  (applies OSFL_CPU_KERNELS before torch loads)

# isort: split
import torch

from osfl.fl.fingerprint import cpu_fingerprint
from osfl.models import create_model


def digest(*tensors: torch.Tensor) -> str:
    """SHA-256 (16 hex digits) of the tensors' float32 bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().to(torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


#: MKL's branch names (mkl_cbwr.h), for the report.
_CBWR = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


def mkl_dispatch() -> dict[str, object] | None:
    """What MKL decided on this CPU, after an SGEMM: the branch in force
    (``MKL_CBWR`` read back: an unsupported one falls back to AUTO), the
    branch AUTO would take, the code path it dispatches to (0: the
    COMPATIBLE path) and whether it takes the CPU for an Intel one. These are
    MKL's internal service symbols in torch's library, read for this report
    only; ``None`` where a build lacks them."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        mkl = ctypes.CDLL(str(lib))
        branch = mkl.mkl_serv_cbwr_get(1)
        auto = mkl.mkl_serv_cbwr_get_auto_branch()
        path, intel = mkl.mkl_serv_cpu_detect(), mkl.mkl_serv_intel_cpu_true()
    except (OSError, AttributeError):
        return None
    return {
        "branch": _CBWR.get(branch, branch),
        "auto_branch": _CBWR.get(auto, auto),
        "code_path": path,
        "intel_cpu": bool(intel),
    }


def gemms(gen: torch.Generator) -> dict[str, str]:
    """SGEMMs at odd shapes and at the default run's im2col shapes (16 px,
    3 → 16 → 32 → 64 channels, batch 32)."""
    shapes = {"gemm_odd": (197, 131, 263), "gemm_conv2": (2048, 144, 32), "gemm_fc": (32, 64, 10)}
    out = {}
    for name, (m, k, n) in shapes.items():
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        out[name] = digest(a @ b, a.t() @ (a @ b))
    return out


def conv(gen: torch.Generator) -> dict[str, str]:
    """A 3×3 convolution forward and backward (input and weight gradients)."""
    x = torch.randn(32, 16, 16, 16, generator=gen, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, generator=gen, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    y.square().mean().backward()
    return {"conv_fwd": digest(y), "conv_bwd": digest(x.grad, w.grad)}


def train_step(gen: torch.Generator) -> dict[str, str | list[float]]:
    """``cnn_small`` after five steps of the default recipe."""
    torch.manual_seed(0)
    model = create_model("cnn_small", num_classes=10, in_chans=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(32, 3, 16, 16, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"step": digest(*model.state_dict().values()), "step_losses": losses}


def main() -> int:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    fp = cpu_fingerprint()
    result = {
        # ATen's capability as torch detects it (CPUID: an emulated CPU shows here;
        # /proc/cpuinfo, and so the fingerprint's vendor, is the host's under qemu-user)
        "kernels": {k: fp[k] for k in ("aten", "onednn_conv", "env")},
        **gemms(gen),
        **conv(gen),
        **train_step(gen),
        "mkl": mkl_dispatch(),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
