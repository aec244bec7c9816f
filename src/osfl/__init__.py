"""osfl: federated learning of image classifiers when communication, client
compute and privacy are scarce.

Sub-packages: :mod:`osfl.data` (ImageSets, sources, partitions, batched
transforms), :mod:`osfl.models` (model registry), :mod:`osfl.fl` (uploads,
methods, local training, runtimes), :mod:`osfl.methods` (FL algorithms),
:mod:`osfl.privacy` (audits). See ``docs/architecture.md``.
"""

import os as _os

__version__ = "0.1.0"

#: ``OSFL_CPU_KERNELS=portable`` pins MKL's code branch to COMPATIBLE and
#: ATen's capability to AVX2 here, before anything imports torch (both are
#: read at torch's first op, not later), and :mod:`osfl.fl.fingerprint` takes
#: convolutions off oneDNN, whose kernels follow the CPU. COMPATIBLE is the
#: one MKL branch its documentation gives the same results on Intel and
#: Intel-compatible (AMD) CPUs; MKL ignores the AVX2 branch (portable's pin
#: before issue 55) on a non-Intel CPU and runs its AUTO branch there
#: instead. REPRODUCTION.md ("How much the machine moves a number") has the
#: digits it gives and how far that was checked. Variables the user set are
#: kept.
if _os.environ.get("OSFL_CPU_KERNELS") == "portable":
    _os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
    _os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
