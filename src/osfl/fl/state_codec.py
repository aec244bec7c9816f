"""A server state to bytes and back, without pickle: what makes a run resumable
(the state after every round is saved and a killed run goes on from it) and
lets a server without a test set hand its final state to the sites that
evaluate it.

Method states are plain structures: mappings (string or integer keys), lists,
tuples, numbers, strings, ``None``, tensors and small dataclasses
(``SchemeState``, ``EFTViTState``). :func:`encode_state` splits one into its
tensors (safetensors) and a JSON skeleton that names each tensor;
:func:`decode_state` rebuilds it. A dataclass is rebuilt only when its class
is registered in :data:`STATE_TYPES` (``@state_type``): the bytes name a
registered type, never a module to import, so a state that crossed a network
cannot make the reader run code. Non-finite floats survive the trip.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from osfl import jsonio
from osfl.errors import DataError
from osfl.registry import Registry

__all__ = [
    "STATE_TYPES",
    "decode_state",
    "encode_state",
    "state_from_bytes",
    "state_to_bytes",
    "state_type",
]

#: Dataclasses a server state may contain, by name (see the module docstring).
STATE_TYPES: Registry[type] = Registry("server state type")
_SKELETON = "osfl_state"
T = TypeVar("T", bound=type)


def state_type(cls: T) -> T:
    """Class decorator: let ``cls`` (a dataclass) appear in saved states."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    STATE_TYPES.register(cls.__name__)(cls)
    return cls


def encode_state(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """``(tensors, skeleton)``: the tensors by generated name, and a JSON-able
    description of the structure that refers to them."""
    encoder = _Encoder()
    skeleton = encoder(state, "")
    return encoder.tensors, skeleton


@dataclasses.dataclass
class _Encoder:
    """Describes a state node by node (``path`` names the node in errors),
    collecting its tensors under generated names in the order met, which
    :class:`_Decoder` reverses."""

    tensors: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __call__(self, x: Any, path: str) -> Any:
        if isinstance(x, torch.Tensor):
            name = f"t{len(self.tensors)}"
            self.tensors[name] = x.detach().to("cpu").contiguous().clone()
            return {"$t": name}
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$f": repr(x)}
        if x is None or isinstance(x, bool | int | str):
            return x
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return self.dataclass(x, path)
        if isinstance(x, Mapping | list | tuple):
            return self.container(x, path)
        if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # numpy scalars
            return self(x.item(), path)
        raise TypeError(f"state at {path or '<root>'}: a {type(x).__name__} cannot be saved")

    def container(self, x: Mapping | list | tuple, path: str) -> dict[str, Any]:
        """A mapping as its ``[key, value]`` pairs (keys need not be strings),
        a list or tuple as its items, tagged so a tuple comes back a tuple."""
        if isinstance(x, Mapping):
            return {"$map": [[self(k, path), self(v, f"{path}.{k}")] for k, v in x.items()]}
        items = [self(v, f"{path}[{i}]") for i, v in enumerate(x)]
        return {"$tuple" if isinstance(x, tuple) else "$list": items}

    def dataclass(self, x: Any, path: str) -> dict[str, Any]:
        """A registered dataclass by name and fields; an unregistered one (or
        another class of that name) is refused, since it could not be rebuilt."""
        name = type(x).__name__
        if name not in STATE_TYPES or STATE_TYPES.get(name) is not type(x):
            raise TypeError(
                f"state at {path or '<root>'}: dataclass {name} is not registered "
                "(decorate it with osfl.fl.state_codec.state_type)"
            )
        fields = {
            f.name: self(getattr(x, f.name), f"{path}.{f.name}") for f in dataclasses.fields(x)
        }
        return {"$dc": name, "fields": fields}


def decode_state(tensors: Mapping[str, torch.Tensor], skeleton: Any) -> Any:
    """The inverse of :func:`encode_state`; anything it does not recognise is
    a :class:`DataError`."""
    return _Decoder(tensors)(skeleton)


@dataclasses.dataclass(frozen=True)
class _Decoder:
    """Rebuilds a skeleton node by node against its ``tensors``: a tagged node
    goes to its tag's step in :data:`_TAGS`, anything else is refused."""

    tensors: Mapping[str, torch.Tensor]

    def __call__(self, x: Any) -> Any:
        if x is None or isinstance(x, bool | int | float | str):
            return x
        if isinstance(x, list):
            raise DataError("saved state: a bare list in the skeleton")
        if not isinstance(x, dict) or len(x) not in (1, 2):
            raise DataError(f"saved state: unrecognised node {str(x)[:80]}")
        tag = next((t for t in _TAGS if t in x), None)
        if tag is None:
            raise DataError(f"saved state: unrecognised node {str(x)[:80]}")
        return _TAGS[tag](self, x)

    def tensor(self, x: dict[str, Any]) -> torch.Tensor:
        if x["$t"] not in self.tensors:
            raise DataError(f"saved state: tensor {x['$t']!r} is missing")
        return self.tensors[x["$t"]]

    def special_float(self, x: dict[str, Any]) -> float:
        """NaN and the infinities, which JSON cannot hold."""
        if x["$f"] not in ("nan", "inf", "-inf"):
            raise DataError(f"saved state: bad float {x['$f']!r}")
        return float(x["$f"])

    def mapping(self, x: dict[str, Any]) -> dict[Any, Any]:
        return {self(k): self(v) for k, v in _pairs(x["$map"])}

    def list_(self, x: dict[str, Any]) -> list[Any]:
        return [self(v) for v in _items(x["$list"])]

    def tuple_(self, x: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(self(v) for v in _items(x["$tuple"]))

    def state_dataclass(self, x: dict[str, Any]) -> Any:
        """Only a type registered in :data:`STATE_TYPES`: the bytes never name code."""
        if x["$dc"] not in STATE_TYPES:
            raise DataError(f"saved state: unknown state type {x['$dc']!r}")
        fields = x.get("fields")
        if not isinstance(fields, dict):
            raise DataError("saved state: a dataclass without fields")
        try:
            return STATE_TYPES.get(x["$dc"])(**{k: self(v) for k, v in fields.items()})
        except TypeError as e:
            raise DataError(f"saved state: {x['$dc']}: {e}") from e


#: Skeleton tag -> the step that decodes its node, in the order a node's tags are tried.
_TAGS: dict[str, Callable[[_Decoder, dict[str, Any]], Any]] = {
    "$t": _Decoder.tensor,
    "$f": _Decoder.special_float,
    "$map": _Decoder.mapping,
    "$list": _Decoder.list_,
    "$tuple": _Decoder.tuple_,
    "$dc": _Decoder.state_dataclass,
}


def _items(x: Any) -> list[Any]:
    if not isinstance(x, list):
        raise DataError("saved state: a list node that is not a list")
    return x


def _pairs(x: Any) -> list[tuple[Any, Any]]:
    items = _items(x)
    if not all(isinstance(p, list) and len(p) == 2 for p in items):
        raise DataError("saved state: a mapping node that is not a list of pairs")
    return [(k, v) for k, v in items]


def state_to_bytes(state: Any) -> bytes:
    """One safetensors blob: the tensors, the skeleton in its header."""
    tensors, skeleton = encode_state(state)
    return save(tensors, metadata={_SKELETON: json.dumps(skeleton, allow_nan=False)})


def state_from_bytes(blob: bytes) -> Any:
    """The inverse of :func:`state_to_bytes` (a damaged blob is a DataError)."""
    try:
        tensors = dict(sorted(load(blob).items()))  # safetensors' order changes per load
        header_len = int.from_bytes(blob[:8], "little")
        header = jsonio.loads(blob[8 : 8 + header_len])
        skeleton = jsonio.loads(header["__metadata__"][_SKELETON])
    except (SafetensorError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"saved state is damaged ({type(e).__name__}: {e})") from e
    return decode_state(tensors, skeleton)
