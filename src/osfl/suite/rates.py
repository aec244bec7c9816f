"""The suite's measurement phase (issue #40): what this machine does per
second, so that a step's cost is its work over a measured rate plus a
measured fixed cost, on any CUDA GPU and with nothing keyed by its name.

Rates (:data:`RATE_KEYS`), each from a few timed steps after a warm-up:

- ``resnet18_32``: images per second of a training step (forward,
  cross-entropy, backward, SGD) of osfl's CIFAR ResNet-18 at 32 px, batch
  256, bf16 autocast and channels_last on a GPU (FAFI's, FedMITR-style
  convnet clients; VGG-16 and LeNet-5 are priced from it by FLOPs);
- ``vits16_224``: the same for a ViT-S/16 at 224 px, batch 128 (ViT-B by
  FLOPs, the MFU step);
- ``vitti16_224``: the same for a ViT-Ti/16 at 224 px, batch 256 (the
  suite's encoder and the rows on it: FedMITR's clients, FALCON's views,
  EFTViT); optional in a saved file (derived from ``vits16_224`` where
  absent: :data:`osfl.suite.steps.DERIVED_RATES`);
- ``decode``: 32-px JPEG files decoded per second by one process with
  Pillow (the image folder's own files; a pack decodes on every core, which
  this under-counts, so estimates err long);
- ``resize_224``: 32-px images upsampled to 224 px per second (Pillow,
  bicubic: today's data path);
- ``startup_s``: a step's own fixed cost, the seconds from nothing to a
  first finished training step (a model built and moved, cuDNN's choices,
  the first kernels), paid once per step.

:func:`measure_rates` takes well under a minute on a GPU and, with
``tiny=True`` (the dry run), a second or two on a CPU with toy shapes.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, DataError
from osfl.suite.bundle import read_json

#: What the planner prices work in (docstring above).
RATE_KEYS = ("resnet18_32", "vits16_224", "decode", "resize_224", "startup_s")
#: Measured when a job measures, derived when a saved file lacks them.
OPTIONAL_RATE_KEYS = ("vitti16_224",)


def _timed_steps(step: Callable[[], None], sync: Callable[[], None], n: int) -> float:
    """Seconds per call of ``step`` over ``n`` calls (after the caller's warm-up)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / n


def _train_rate(
    name: str, size: int, batch: int, steps: int, device: Any, **kwargs: Any
) -> tuple[float, float]:
    """(images/s, seconds to the first finished step) of one training step of
    model ``name`` at ``size`` px: bf16 autocast on CUDA, channels_last for
    convnets there (what the training step uses on a GPU)."""
    # heavy: torch and the models
    import torch

    from osfl.models import create_model  # heavy: torch

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, **kwargs).to(device).train()
    fmt = torch.channels_last if cuda and not name.startswith("vit") else torch.contiguous_format
    model = model.to(memory_format=fmt)
    chans = int(kwargs.get("in_chans", 3))
    x = torch.randn(batch, chans, size, size, device=device).to(memory_format=fmt)
    y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    sync()
    first = time.perf_counter() - t0
    step()  # warm-up
    return batch / _timed_steps(step, sync, steps), first


def _jpegs(n: int) -> list[bytes]:
    """``n`` 32-px JPEG files of random pixels (CIFAR-10's pack holds such files)."""
    import numpy as np  # heavy: numpy
    from PIL import Image  # heavy: Pillow

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
        out.append(buf.getvalue())
    return out


def _image_rates(n: int, size: int) -> tuple[float, float]:
    """(decodes/s, resizes/s to ``size`` px) of 32-px JPEGs with Pillow, one process."""
    from PIL import Image  # heavy: Pillow

    files = _jpegs(n)
    t0 = time.perf_counter()
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in files]
    decode = n / max(time.perf_counter() - t0, 1e-9)
    t0 = time.perf_counter()
    for im in images:
        im.resize((size, size), Image.BICUBIC)
    return decode, n / max(time.perf_counter() - t0, 1e-9)


def measure_rates(*, tiny: bool = False, device: str | None = None) -> dict[str, Any]:
    """Measure :data:`RATE_KEYS` on ``device`` (default: CUDA when present).

    ``tiny`` (the dry run): toy shapes on a CPU, the same code path; its
    rates price only the catalogue's tiny commands. Returns the rates with
    ``machine`` (the GPU's name or ``cpu``, for the record only) and the
    measurement's own seconds."""
    import torch  # heavy: torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if not tiny and dev.type != "cuda":
        # paper-scale shapes on a CPU would take minutes to price steps it cannot run
        raise ConfigError("measuring a GPU's rates needs a CUDA device; use --dry-run on a CPU")
    t0 = time.perf_counter()
    if tiny:
        r18, first = _train_rate("cnn_small", 8, 4, 2, dev)
        vit_kw = {"img_size": 8, "patch_size": 2, "depth": 1, "embed_dim": 32, "num_heads": 2}
        vit, _ = _train_rate("vit_tiny_patch2_16", 8, 4, 2, dev, **vit_kw)
        vitti = vit
        decode, resize = _image_rates(16, 8)
    else:
        r18, first = _train_rate("resnet18", 32, 256, 20, dev)
        vit, _ = _train_rate("vit_small_patch16_224", 224, 128, 10, dev)
        vitti, _ = _train_rate("vit_tiny_patch16_224", 224, 256, 10, dev)
        decode, resize = _image_rates(2000, 224)
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the measurement's models and batches are gone
    return {
        "resnet18_32": r18,
        "vits16_224": vit,
        "vitti16_224": vitti,
        "decode": decode,
        "resize_224": resize,
        "startup_s": first,
        "machine": machine,
        "tiny": tiny,
        "seconds": time.perf_counter() - t0,
    }


def check_rates(rates: Mapping[str, Any], where: str = "rates") -> dict[str, Any]:
    """``rates`` if every :data:`RATE_KEYS` value (and every
    :data:`OPTIONAL_RATE_KEYS` value present) is a finite positive number
    (``startup_s`` may be 0); else a :class:`DataError` naming the first bad one."""
    if not isinstance(rates, Mapping):
        raise DataError(f"{where}: not an object of rates")
    for key in (*RATE_KEYS, *(k for k in OPTIONAL_RATE_KEYS if k in rates)):
        v = rates.get(key)
        ok = isinstance(v, int | float) and math.isfinite(v) and v >= 0
        if not ok or (key != "startup_s" and v == 0):
            raise DataError(f"{where}: {key} must be a positive number, got {v!r}")
    return dict(rates)


def read_rates(path: Path) -> dict[str, Any] | None:
    """The rates saved by an earlier call (``None``: none there); a damaged
    file is a :class:`DataError` (one line), never a traceback."""
    if not path.exists():
        return None
    try:
        doc = read_json(path, dict)
    except DataError as e:
        raise DataError(f"{e}; remove it to measure again") from None
    return check_rates(doc, str(path))
