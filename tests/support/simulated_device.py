"""A simulated accelerator, so that device placement is tested on a machine
without a GPU (used by ``tests/fl/test_device_placement.py``; not a test module).

The bug it exists to catch: a tensor made on the CPU (``torch.zeros(n)``,
``torch.tensor(list)``, ``torch.from_numpy(a)``, a CPU ``Generator``) meeting a
model and batches that live on the GPU. On a CUDA machine that raises
"Expected all tensors to be on the same device"; on a CPU-only machine, where
every test runs, nothing is on another device and the bug hides.

Why not ``torch._subclasses.fake_tensor.FakeTensorMode`` with ``device="cuda"``,
the obvious tool: measured on the CPU build of torch 2.13 (the one CI runs),
fake CUDA tensors can be *made* by factory functions, but (1) ``tensor.to("cuda")``
and so ``model.to("cuda")`` are refused ("PyTorch is not linked with support for
cuda devices"), and (2) the first autograd node recorded on a fake CUDA tensor
aborts the whole process (``getDeviceGuardImpl`` finds no CUDA device guard: the
CPU build has none, and ``_ensureCUDADeviceGuardSet`` only replaces one that
exists). Fake tensors also carry no values, so ``loss.item()``, a loss-health
check or a data-dependent branch cannot run. The ``meta`` device has the last
problem too.

What this module does instead:

- it registers torch's *privateuse1* device slot under the name ``simgpu``
  with the Python device guard torch ships for exactly this purpose
  (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``),
  so autograd accepts tensors on it;
- a tensor "on" ``simgpu`` is a wrapper subclass that reports
  ``device == simgpu:0`` and holds a real CPU tensor: every op runs for real,
  so training, ``.item()``, losses and accuracies are the CPU's numbers;
- a ``TorchDispatchMode`` (:class:`_PlacementMode`) sees every aten op and
  applies the CUDA rules: all tensor arguments on one device, except CPU
  0-dim tensors (scalars), the indices of ``index``/``index_put_`` (CUDA takes
  CPU indices), and the copies ``copy_``/``_to_copy``; a violation raises
  :class:`PlacementError` naming the op and the devices;
- a ``TorchFunctionMode`` (:class:`_GeneratorMode`) applies CUDA's generator
  rule (a random op on the GPU needs a GPU generator: "Expected a 'cuda' device
  type for generator"), at the Python call, where the generator object still
  says its device; ``torch.Generator(device="simgpu")`` gives a CPU generator
  that says it is on ``simgpu``;
- ``.numpy()`` (and so ``np.asarray``) of a ``simgpu`` tensor raises, as it
  does for a CUDA tensor ("can't convert cuda:0 device type tensor to numpy");
- inside :func:`count_syncs`, every op that would make the host wait for a
  GPU is logged as a :class:`SyncEvent` (issue #40: a training step that
  never waits on the CPU): reading a value (``.item()``, ``float``/``bool``
  of a tensor, ``.tolist()``), a blocking copy to the host (``.cpu()``,
  ``.to("cpu")``) or *from* it (``torch.tensor(data, device=...)``, a CPU
  tensor's ``.to(device)``: CUDA's blocking copy waits for its stream), an op
  whose output size depends on values (``nonzero``, boolean indexing,
  ``masked_select``, ``unique``, ``repeat_interleave`` without
  ``output_size``), indexing with CPU index tensors (copied to the device),
  ``torch.equal``, and ``torch.cuda.synchronize`` /
  ``torch.accelerator.synchronize``. A ``non_blocking=True`` copy is not
  counted: from or to pinned memory CUDA does not wait (the simulation has no
  pinned memory, so it cannot check that the host buffer is pinned).

Where the simulation cannot follow a real GPU (say so in a test that relies on
it): code that branches on ``device.type == "cuda"`` (AMP, ``torch.cuda.*``)
takes its CPU path, because the simulated device is not called ``cuda``; CUDA
streams, pinned memory and asynchronous copies are not modelled (``non_blocking``
copies are synchronous here); ops torch implements below the dispatcher
(C++-only helpers that read ``data_ptr``) see the wrapper's CPU data; torch
picks kernels by device type, so ``scaled_dot_product_attention`` runs its
math path here, not the fused CPU kernel (results differ in the last bits).
The modes are thread-local, as torch's dispatch modes are: work a thread
pool does (``parallel_clients > 1``) is not checked, and a raw op on
``simgpu`` there fails with "Could not run ... from the 'simgpu' backend".
An exception raised by a tensor hook during ``backward`` of a ``simgpu``
tensor aborts the whole process ("terminate called without an active
exception", torch 2.13), where CUDA raises it to the caller: a test that
expects a hook to fail there calls the hook itself
(``tests/methods/fafi/test_local_wiring.py``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map

#: The simulated accelerator's device type (torch's privateuse1 slot, renamed).
DEVICE_TYPE = "simgpu"

aten = torch.ops.aten
_CPU = torch.device("cpu")
_GENERATOR = torch._C.Generator  # the real class, whatever torch.Generator is patched to

#: ops CUDA runs on arguments from two devices (a copy between them)
_COPIES = frozenset({aten.copy_.default, aten._to_copy.default})
#: ops whose second argument (a list of index tensors) may stay on the CPU
_INDEXING = frozenset(
    {
        aten.index.Tensor,
        aten.index_put_.default,
        aten.index_put.default,
        aten._index_put_impl_.default,
        aten._unsafe_index.Tensor,
    }
)


#: ops whose output size depends on the values: CUDA copies a count to the host
_DATA_DEPENDENT = frozenset(
    {
        aten.nonzero.default,
        aten.masked_select.default,
        aten._unique.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.equal.default,
        aten.is_nonzero.default,
        aten._local_scalar_dense.default,
    }
)


@dataclass(frozen=True)
class SyncEvent:
    """One point where the host would wait for the GPU: ``kind`` (``read``, a
    value to the host; ``d2h`` / ``h2d``, a blocking copy; ``shape``, an op
    whose output size depends on values; ``sync``, an explicit
    synchronize), the op, and the innermost ``src/osfl`` frame that asked."""

    kind: str
    op: str
    where: str


@dataclass
class SyncLog:
    """What :func:`count_syncs` saw, in order."""

    events: list[SyncEvent] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)

    def since(self, start: int) -> list[SyncEvent]:
        """The events after the first ``start`` (a step's, given its start count)."""
        return self.events[start:]


#: the log :func:`count_syncs` fills (thread-local in effect: the modes are)
_SYNC_LOG: SyncLog | None = None


def _caller() -> str:
    """The innermost frame in osfl's sources (else the innermost outside torch)."""
    frames = traceback.extract_stack()[:-2]
    for f in reversed(frames):
        if "/osfl/" in f.filename.replace("\\", "/") and "/tests/" not in f.filename:
            return f"{f.filename.rsplit('/src/', 1)[-1]}:{f.lineno} ({f.name})"
    for f in reversed(frames):
        if "/torch/" not in f.filename and "simulated_device" not in f.filename:
            return f"{f.filename}:{f.lineno} ({f.name})"
    return "?"


def _log_sync(kind: str, op: object) -> None:
    if _SYNC_LOG is not None:
        _SYNC_LOG.events.append(SyncEvent(kind, str(op), _caller()))


def _sync_kind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Whether ``func`` on these arguments makes CUDA's host wait, and how."""
    if func in _DATA_DEPENDENT:
        on = any(isinstance(t, OnDevice) for t in tree_flatten((args, kwargs))[0])
        if not on:
            return None
        return "read" if func is aten._local_scalar_dense.default else "shape"
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "shape" if isinstance(args[0], OnDevice) else None
    if func in _INDEXING:
        if not isinstance(args[0], OnDevice):
            return None
        indices = [i for i in (args[1] if len(args) > 1 else ()) or () if i is not None]
        if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "shape"  # a mask is turned into indices: nonzero()
        if any(_device_of(i).type == "cpu" and i.dim() > 0 for i in indices):
            return "h2d"  # CUDA takes CPU indices, by a blocking copy
        return None
    if func in _COPIES:
        if kwargs.get("non_blocking") or (func is aten.copy_.default and len(args) > 2 and args[2]):
            return None
        src = args[1] if func is aten.copy_.default else args[0]
        dst = _target(func, args, kwargs)
        src_dev = _device_of(src)
        if dst is None or src_dev.type == dst.type:
            return None
        return "d2h" if src_dev.type == DEVICE_TYPE else "h2d"
    return None


class PlacementError(RuntimeError):
    """One op received tensors (or a generator) on different devices, as CUDA
    would refuse them."""


def _register_backend() -> torch.device:
    """Name torch's privateuse1 slot ``simgpu`` once per process (torch allows
    one rename); its Python device guard lets autograd record ops on it."""
    if torch._C._get_privateuse1_backend_name() != DEVICE_TYPE:
        # heavy: backend registration, needed only by the tests that simulate a device
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(rename=DEVICE_TYPE)
    return torch.device(DEVICE_TYPE, 0)


# At import, not on first use: the autograd engine sizes its per-device queues
# once, at the process's first backward pass, from the devices registered then.
# Test modules are imported at collection, before any test runs a backward.
_register_backend()


class OnDevice(torch.Tensor):
    """A real CPU tensor (``elem``) that reports the simulated device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> OnDevice:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=torch.device(DEVICE_TYPE, 0),
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    # every op is handled by _PlacementMode; the subclass itself adds nothing
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return NotImplemented

    def tolist(self) -> Any:  # a CUDA tensor's tolist copies to the host; so does this
        _log_sync("read", "Tensor.tolist")
        return self.elem.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
            "the tensor to host memory first."
        )

    def data_ptr(self) -> int:  # pointer identity (safetensors' shared-storage check)
        return self.elem.data_ptr()

    def untyped_storage(self) -> Any:
        return self.elem.untyped_storage()

    def __deepcopy__(self, memo: dict[int, Any]) -> OnDevice:
        # copy.deepcopy(state_dict) (a best-epoch snapshot): a copy on the same device
        if id(self) not in memo:
            with torch.no_grad():
                out = OnDevice(self.elem.clone())
            out.requires_grad_(self.requires_grad)
            memo[id(self)] = out
        return memo[id(self)]

    def __repr__(self, **kwargs: Any) -> str:
        return f"OnDevice({self.elem!r}, device='{self.device}')"


def _device_of(t: torch.Tensor) -> torch.device:
    return torch.device(DEVICE_TYPE, 0) if isinstance(t, OnDevice) else t.device


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes into: an in-place op's ``self``, an ``out=``."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if isinstance(value, torch.Tensor):
                out.append(value)
    return out


def _checked_devices(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[torch.device]:
    """The devices of the tensors whose placement must agree in ``func``. A CPU
    0-dim tensor is exempt as an input (CUDA reads it as a scalar), not as the
    tensor written into: ``cpu_sum += cuda_loss`` raises on a GPU; so are CPU
    indices into a device tensor, not device indices into a CPU tensor."""
    written = _written(func, args, kwargs)
    devices: set[torch.device] = set()
    if func in _INDEXING:
        # CUDA accepts CPU index tensors into a device tensor, not device ones into a CPU tensor
        indices = [i for i in (args[1] if len(args) > 1 else ()) or () if i is not None]
        devices = {_device_of(i) for i in indices if _device_of(i).type != "cpu"}
        args = (args[0], *args[2:])
    leaves = tree_flatten((args, kwargs))[0]
    return devices | {
        _device_of(t)
        for t in leaves
        if isinstance(t, torch.Tensor)
        and not (_device_of(t).type == "cpu" and t.dim() == 0 and not any(t is w for w in written))
    }


def _target(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """Where ``func``'s outputs live: its ``device=`` argument, a copy's
    destination, or the device of its device tensors."""
    if func is aten.copy_.default:
        return _device_of(args[0])
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    if func is aten._to_copy.default:
        return _device_of(args[0])
    leaves = tree_flatten((args, kwargs))[0]
    on = any(isinstance(t, OnDevice) for t in leaves)
    return torch.device(DEVICE_TYPE, 0) if on else None


def _unwrap(x: Any) -> Any:
    if isinstance(x, OnDevice):
        return x.elem
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return _CPU
    return x


class _PlacementMode(TorchDispatchMode):
    """Every aten op: check CUDA's placement rule, run on the CPU data, label
    the outputs with the device they would have on the GPU."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _SYNC_LOG is not None:
            kind = _sync_kind(func, args, kwargs)
            if kind is not None:
                _log_sync(kind, func)
        if func not in _COPIES:
            devices = _checked_devices(func, args, kwargs)
            if len(devices) > 1:
                raise PlacementError(
                    f"{func} got tensors on {' and '.join(sorted(map(str, devices)))}: "
                    "on a GPU this raises 'Expected all tensors to be on the same device'"
                )
        target = _target(func, args, kwargs)
        u_args, u_kwargs = tree_map(_unwrap, (args, kwargs))
        out = func(*u_args, **u_kwargs)
        if target is not None and target.type == DEVICE_TYPE:
            out = tree_map(
                lambda x: (
                    OnDevice(x)
                    if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice)
                    else x
                ),
                out,
            )
        return return_and_correct_aliasing(func, args, kwargs, out)


def _generator_device(g: torch.Generator) -> torch.device:
    return getattr(g, "simulated_device", None) or _GENERATOR.device.__get__(g)


class _GeneratorMode(TorchFunctionMode):
    """CUDA's generator rule, checked where the generator still says its device
    (the dispatcher hands the mode a fresh Python object)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        g = kwargs.get("generator")
        if isinstance(g, _GENERATOR):
            target = kwargs.get("device")
            if target is None:
                leaves = tree_flatten(args)[0]
                first = next((a for a in leaves if isinstance(a, torch.Tensor)), None)
                target = first.device if first is not None else torch.get_default_device()
            target = torch.device(target)
            if _generator_device(g).type != target.type:
                name = getattr(func, "__name__", str(func))
                raise PlacementError(
                    f"{name}: a generator on {_generator_device(g).type} draws for a tensor on "
                    f"{target}: on a GPU this raises \"Expected a '{target.type}' device type for "
                    'generator"'
                )
        return func(*args, **kwargs)


class _GeneratorMeta(type(_GENERATOR)):  # type: ignore[misc]
    """``isinstance(g, torch.Generator)`` stays true for every generator while
    ``torch.Generator`` is the simulated class."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _GENERATOR)


class SimulatedGenerator(_GENERATOR, metaclass=_GeneratorMeta):
    """``torch.Generator(device=...)`` while the simulation runs: a CPU
    generator that remembers (and reports) the device it was asked for."""

    def __new__(cls, device: Any = "cpu") -> SimulatedGenerator:
        g = super().__new__(cls)
        g.simulated_device = torch.device(device)
        return g

    def __init__(self, device: Any = "cpu") -> None:
        pass

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.simulated_device


@contextmanager
def simulated_device() -> Iterator[torch.device]:
    """Inside the block, ``torch.device("simgpu")`` behaves as a GPU for
    placement: yields that device; an op that mixes devices as CUDA forbids
    raises :class:`PlacementError`."""
    device = _register_backend()
    saved: Callable[..., Any] = torch.Generator
    lift = torch._C._only_lift_cpu_tensors()
    # torch.tensor(data, device=...) builds the tensor below the modes; keep it
    # on the host so that its move to the device goes through _to_copy (as
    # FakeTensorMode does)
    torch._C._set_only_lift_cpu_tensors(True)
    # module.to(cuda) keeps every Parameter object (torch assigns param.data:
    # CPU and CUDA tensors share a TensorImpl type); to a wrapper subclass it
    # would make new Parameters, and code holding the old ones (EFTViT's server
    # reads its trained weights through them) would see no training: swap the
    # tensors in place instead, so identities survive as on a GPU
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    torch.Generator = SimulatedGenerator  # type: ignore[misc]
    try:
        with _GeneratorMode(), _PlacementMode():
            yield device
    finally:
        torch.Generator = saved  # type: ignore[misc]
        torch._C._set_only_lift_cpu_tensors(lift)
        torch.__future__.set_swap_module_params_on_conversion(swap)


@contextmanager
def count_syncs() -> Iterator[SyncLog]:
    """Log, inside a :func:`simulated_device` block, every point where the
    host would wait for the GPU (module docstring): yields the :class:`SyncLog`.

    ``torch.cuda.synchronize`` and ``torch.accelerator.synchronize`` are
    replaced by a logged no-op meanwhile (the CPU build has no CUDA to wait for).
    """
    global _SYNC_LOG
    saved_log = _SYNC_LOG
    log = SyncLog()
    patched: list[tuple[Any, str, Any]] = []
    for mod in (torch.cuda, getattr(torch, "accelerator", None)):
        if mod is not None and hasattr(mod, "synchronize"):
            patched.append((mod, "synchronize", mod.synchronize))
            mod.synchronize = lambda *a, **k: _log_sync("sync", "synchronize")
    _SYNC_LOG = log
    try:
        yield log
    finally:
        _SYNC_LOG = saved_log
        for mod, name, fn in patched:
            setattr(mod, name, fn)
