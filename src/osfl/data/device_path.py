"""Where a batch's augmentations run, and how they draw on a device (issue #40).

On the CPU every transform runs as it always has (the same random stream, the
same kernels: documented numbers stay bit for bit). Off the CPU
(:func:`device_path`) nothing makes the host wait for the GPU: augmentations
draw from a generator *on the batch's device* (:func:`augmentation_generator`,
seeded from the run's CPU generator, so a seed still fixes every view) and
constants are made once per device and dtype (:func:`_const`).
:func:`emulate_device_path` runs the device path on the CPU, so that tests can
compare a simulated GPU with the CPU bit for bit. A module of its own because
the transforms (:mod:`osfl.data.batch_transforms`, :mod:`osfl.data.colour`)
and the training loop all ask it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

#: Set inside :func:`emulate_device_path`: the CPU takes the device path too.
_EMULATE: ContextVar[bool] = ContextVar("osfl_emulate_device_path", default=False)


def device_path(device: torch.device | str) -> bool:
    """Whether work on ``device`` takes the sync-free device path (module
    docstring): off the CPU always; on the CPU only inside
    :func:`emulate_device_path`, so that CPU numbers never change."""
    return torch.device(device).type != "cpu" or _EMULATE.get()


@contextmanager
def emulate_device_path() -> Iterator[None]:
    """Run the device path on the CPU inside the block (a separate, seeded
    augmentation generator, ``torch.where`` selections): what a GPU run
    computes, on the CPU's kernels. For tests that compare a simulated device
    with the CPU bit for bit; a real run never needs it."""
    token = _EMULATE.set(True)
    try:
        yield
    finally:
        _EMULATE.reset(token)


def augmentation_generator(
    generator: torch.Generator | None, device: torch.device | str
) -> torch.Generator | None:
    """The generator a batch on ``device`` should draw its augmentations from.

    On the CPU path: ``generator`` itself (today's stream, interleaved with the
    loader's permutations: bit-identical numbers). On the device path: a new
    generator on ``device`` seeded from a hash of ``generator``'s state, which
    is read, not advanced (so the first epoch's batches are the CPU path's;
    later epochs differ, as the CPU path's augmentations advanced the shared
    generator between them); drawing there needs no host-to-device copy per
    batch, which would wait for the GPU. A generator already off the CPU is
    used as it is.
    """
    device = torch.device(device)
    if generator is None or not device_path(device) or generator.device.type != "cpu":
        return generator
    state = generator.get_state()
    digest = hashlib.blake2b(bytes(state.numpy()), digest_size=8, person=b"osfl-aug").digest()
    seed = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    return torch.Generator(device=device).manual_seed(seed)


#: Constant tensors per (values, dtype, device): made (copied to a GPU) once,
#: not per batch, because a blocking host-to-device copy waits for the GPU.
_CONSTS: dict[tuple[tuple[float, ...], torch.dtype, torch.device], torch.Tensor] = {}


def _const(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values)`` as a 1×C×1×1 tensor, cached per dtype and device
    (the same values as a fresh one: CPU numbers do not change). Made outside
    any ``inference_mode``, so that a later step with autograd may save it."""
    key = (values, dtype, device)
    t = _CONSTS.get(key)
    if t is None:
        with torch.inference_mode(False):
            t = torch.tensor(values, dtype=dtype, device=device).view(1, -1, 1, 1)
        _CONSTS[key] = t
    return t


def _rand(
    shape: Sequence[int], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """U[0, 1) on the generator's device, moved to ``device``."""
    gdev = generator.device if generator is not None else device
    return torch.rand(tuple(shape), generator=generator, device=gdev).to(device)
