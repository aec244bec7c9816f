"""osfl: federated learning of image classifiers when communication, client
compute and privacy are scarce.

Sub-packages: :mod:`osfl.data` (ImageSets, sources, partitions, batched
transforms), :mod:`osfl.models` (model registry), :mod:`osfl.fl` (uploads,
methods, local training, runtimes), :mod:`osfl.methods` (FL algorithms),
:mod:`osfl.privacy` (audits). See ``docs/architecture.md``.
"""

import os as _os

__version__ = "0.1.0"

#: ``OSFL_CPU_KERNELS=portable`` pins MKL's branch and ATen's capability to
#: AVX2 here, before anything imports torch (both are read at torch's first
#: op, not later), and :mod:`osfl.fl.fingerprint` takes convolutions off
#: oneDNN, whose kernels follow the CPU: numbers that should not depend on
#: the x86 CPU kind, at about 1.27x the default run's time (REPRODUCTION.md,
#: "How to read the numbers"). Variables the user set are kept.
if _os.environ.get("OSFL_CPU_KERNELS") == "portable":
    _os.environ.setdefault("MKL_CBWR", "AVX2")
    _os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
