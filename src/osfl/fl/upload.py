"""What crosses the network: :class:`Upload` (client -> server) and
:class:`Broadcast` (server -> client), docs/design.md §2.

A message is named tensors plus JSON-able metadata. It is serialised with
safetensors (the metadata travels as one JSON string in the safetensors
header), so no pickle is ever involved on the wire, and its byte size is the
exact length of that serialisation: the number every byte-accounting table
reports. :func:`validate` checks a received message against an
:class:`UploadSpec` before a method sees it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from osfl import jsonio
from osfl.errors import UploadError

#: The safetensors header key that carries a message's JSON metadata.
META_KEY = "osfl_meta"
#: Bounds on a received message's metadata JSON (a peer's text): osfl's own
#: metadata nests three levels and holds a few counts per class.
MAX_META_DEPTH = 16
MAX_META_CHARS = 1 << 20
#: A refusal reason quotes at most this many characters of a peer's value (a
#: 401-digit ``num_samples`` or a key of a megabyte stays one short log line).
SHOWN_CHARS = 40


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def quoted(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A peer's ``value`` as a refusal reason quotes it: its ``repr``, bounded (:func:`cut`)."""
    return cut(repr(value), limit)


@dataclass
class Message:
    """Named tensors + JSON-able metadata."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """safetensors bytes; tensors are made contiguous and moved to CPU."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.tensors.items()}
        try:
            meta = json.dumps(self.meta, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UploadError(f"metadata is not JSON-serialisable: {e}", field="meta") from e
        return st_save(tensors, metadata={META_KEY: meta})

    @classmethod
    def from_bytes(cls, data: bytes, *, client: int | str | None = None) -> Message:
        """Parse safetensors bytes, the tensors in sorted order of their names
        (a canonical order: nothing the server computes may depend on the
        order a dict holds them in); malformed input raises :class:`UploadError`."""
        try:
            tensors = st_load(bytes(data))
            header_len = int.from_bytes(data[:8], "little")
            header = jsonio.loads(data[8 : 8 + header_len], max_depth=MAX_META_DEPTH)
            meta_raw = (header.get("__metadata__") or {}).get(META_KEY, "{}")
        except Exception as e:  # safetensors raises several error types
            raise UploadError(
                f"not a valid safetensors message: {cut(str(e), 200)}", client=client, field="*"
            ) from e
        try:
            meta = jsonio.loads(meta_raw, max_depth=MAX_META_DEPTH, max_chars=MAX_META_CHARS)
        except (TypeError, ValueError) as e:
            why = cut(str(e), 200)
            raise UploadError(f"metadata is not JSON: {why}", client=client, field="meta") from e
        if not isinstance(meta, dict):
            raise UploadError("metadata must be a JSON object", client=client, field="meta")
        # safetensors' load hands the tensors back in an order that changes from
        # one call to the next: sorted names make every decoded message the same
        return cls(tensors=dict(sorted(tensors.items())), meta=meta)

    @property
    def nbytes(self) -> int:
        """Exact size on the wire: the length of :meth:`to_bytes`."""
        return len(self.to_bytes())

    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.tensors.values())


class Upload(Message):
    """A client's message to the server."""


class Broadcast(Message):
    """The server's message to the clients of one round."""


#: One dimension of a TensorSpec's shape: a size, ``None`` (any), the name of an
#: integer metadata value, or ``(name, i)``: item ``i`` of an ``int_list`` one.
Dim = int | None | str | tuple[str, int]


@dataclass(frozen=True)
class TensorSpec:
    """Expected shape and dtype of one tensor, whether it must be finite, and an
    optional value range (``low`` / ``high``, inclusive: e.g. a BatchNorm
    ``running_var`` is never negative). A dimension may be ``None`` (any size)
    or tie the size to the upload's metadata (see :data:`Dim`): EFTViT's
    ``features.<c>`` has ``meta.counts[c]`` rows."""

    shape: tuple[Dim, ...] | None = None
    dtype: torch.dtype | None = None
    finite: bool = True
    low: float | None = None
    high: float | None = None

    def problem(self, tensor: Any, meta: Mapping[str, Any]) -> str | None:
        """Why ``tensor`` does not fit (``None`` when it does); ``meta`` (already
        validated) sizes the dimensions tied to it. The cheap checks come first:
        a wrong dtype or shape is refused before its values are scanned."""
        if not isinstance(tensor, torch.Tensor):
            return f"not a tensor: {type(tensor).__name__}"
        if self.dtype is not None and tensor.dtype != self.dtype:
            return f"dtype {tensor.dtype}, expected {self.dtype}"
        if self.shape is not None:
            want = tuple(_dim(d, meta) for d in self.shape)
            ok = len(want) == tensor.ndim and all(
                e is None or e == s for e, s in zip(want, tensor.shape, strict=False)
            )
            if not ok:
                return f"shape {cut(str(tuple(tensor.shape)), 80)}, expected {want}"
        return self.value_problem(tensor)

    def value_problem(self, tensor: torch.Tensor) -> str | None:
        """NaN/Inf and values outside ``[low, high]``: the checks that read every value."""
        if self.finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return "contains NaN or Inf"
        if self.low is not None and tensor.numel() and bool((tensor < self.low).any()):
            return f"values below {self.low}"
        if self.high is not None and tensor.numel() and bool((tensor > self.high).any()):
            return f"values above {self.high}"
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(float(v))


#: metadata kind -> (check of a value, what the error says it must be)
_META_KINDS: dict[str, tuple[Any, str]] = {
    "int": (_is_int, "an integer"),
    "real": (_is_real, "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int_list": (
        lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
        "a list of integers",
    ),
}


@dataclass(frozen=True)
class MetaSpec:
    """One metadata value: its ``kind`` (``int``, ``real``, ``str``, ``bool``,
    ``int_list``), inclusive bounds ``low``/``high`` (for a list: of every
    item), a list's exact ``length``, ``sum_of``: the name of an ``int`` key
    the list must sum to (per-class counts that add up to the sample count),
    and ``choices``: the values a ``str`` may take."""

    kind: str = "int"
    low: float | None = None
    high: float | None = None
    length: int | None = None
    sum_of: str | None = None
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in _META_KINDS:
            raise ValueError(f"MetaSpec kind must be one of {', '.join(_META_KINDS)}")

    def problem(self, value: Any, meta: Mapping[str, Any]) -> str | None:
        """Why ``value`` does not fit (``None`` when it does)."""
        ok, what = _META_KINDS[self.kind]
        if not ok(value):
            return f"must be {what}, got {type(value).__name__}"
        items = value if isinstance(value, list) else [value]
        if self.length is not None and len(items) != self.length:
            return f"must have {self.length} items, got {len(items)}"
        for x in items if self.kind in ("int", "real", "int_list") else ():
            if (self.low is not None and x < self.low) or (self.high is not None and x > self.high):
                return f"{quoted(x)} lies outside [{self.low}, {self.high}]"
        if self.choices is not None and value not in self.choices:
            return f"{quoted(value)} is not one of {', '.join(self.choices)}"
        if self.sum_of is not None and sum(items) != meta.get(self.sum_of):
            total, want = quoted(sum(items)), quoted(meta.get(self.sum_of))
            return f"sums to {total}, not to meta.{self.sum_of}={want}"
        return None


#: The sample count every weight-averaging method reads (at least one sample).
NUM_SAMPLES = MetaSpec("int", low=1)


@dataclass(frozen=True)
class UploadSpec:
    """What a method accepts from a client.

    ``tensors`` maps required keys to :class:`TensorSpec`; ``optional`` keys
    may be absent; ``allow_extra`` admits unknown keys (default: refused);
    ``max_bytes`` caps the serialised size; ``meta`` maps each required
    metadata key to its :class:`MetaSpec` (unknown metadata keys are refused).
    """

    tensors: Mapping[str, TensorSpec] = field(default_factory=dict)
    optional: Mapping[str, TensorSpec] = field(default_factory=dict)
    allow_extra: bool = False
    max_bytes: int | None = None
    meta: Mapping[str, MetaSpec] = field(default_factory=dict)
    variants: Mapping[str, UploadSpec] = field(default_factory=dict)
    variant_key: str | None = None

    def variant(self, name: str) -> UploadSpec:
        """This spec merged with its variant ``name`` (tensors, optional keys and
        metadata of both; the variant key itself a string that must be ``name``)."""
        v = self.variants[name]
        key = {self.variant_key: MetaSpec("str", choices=(name,))} if self.variant_key else {}
        return UploadSpec(
            tensors={**self.tensors, **v.tensors},
            optional={**self.optional, **v.optional},
            allow_extra=self.allow_extra or v.allow_extra,
            max_bytes=v.max_bytes if v.max_bytes is not None else self.max_bytes,
            meta={**self.meta, **v.meta, **key},
        )

    def resolve(self, meta: Mapping[str, Any], *, client: int | str | None = None) -> UploadSpec:
        """The exact spec of an upload with this ``meta``: itself, or, for a spec
        with variants (an upload that takes one of several forms, e.g. FALCON's
        sequences *or* generator), the variant its ``meta[variant_key]`` names."""
        if not self.variants:
            return self
        chosen = meta.get(self.variant_key) if self.variant_key else None
        if not isinstance(chosen, str) or chosen not in self.variants:
            raise UploadError(
                f"must name its form, one of {', '.join(sorted(self.variants))}; "
                f"got {quoted(chosen)}",
                client=client,
                field=f"meta.{self.variant_key}",
            )
        return self.variant(chosen)


def _some(keys: list[str], shown: int = 4) -> str:
    """``tensor(s): a, b, c, d and 98 more`` (an error line stays readable)."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"tensor(s): {', '.join(cut(k) for k in keys[:shown])}{more}"


def validate(message: Message, spec: UploadSpec, *, client: int | str | None = None) -> None:
    """Check keys, shapes, dtypes, finiteness, value ranges and metadata;
    raise :class:`UploadError`. (The size is checked on the raw bytes, before
    parsing: :func:`receive`.) A spec with variants checks the variant the
    upload's metadata names.

    The error names the client and the offending field, so a server can log
    the refusal and go on with the other clients.
    """
    spec = spec.resolve(message.meta, client=client)
    _check_names(message, spec, client)
    _check_meta(message, spec, client)
    for name, tensor in message.tensors.items():
        ts = spec.tensors.get(name) or spec.optional.get(name)
        why = None if ts is None else ts.problem(tensor, message.meta)
        if why is not None:
            raise UploadError(why, client=client, field=cut(name))


def _check_names(message: Message, spec: UploadSpec, client: int | str | None) -> None:
    """Every required tensor present, no unknown one unless the spec admits extras."""
    names = set(message.tensors)
    missing = sorted(set(spec.tensors) - names)
    if missing:
        raise UploadError(f"missing {_some(missing)}", client=client, field=cut(missing[0]))
    known = set(spec.tensors) | set(spec.optional)
    extra = sorted(names - known)
    if extra and not spec.allow_extra:
        raise UploadError(f"unexpected {_some(extra)}", client=client, field=cut(extra[0]))


def _check_meta(message: Message, spec: UploadSpec, client: int | str | None) -> None:
    """Exactly the spec's metadata keys, each value fitting its :class:`MetaSpec`
    (checked before the tensors, whose shapes may depend on it)."""
    extra_meta = sorted(set(message.meta) - set(spec.meta))
    if extra_meta:
        field_name = f"meta.{cut(extra_meta[0])}"
        raise UploadError("unexpected metadata key", client=client, field=field_name)
    for key, ms in spec.meta.items():
        if key not in message.meta:
            raise UploadError("missing metadata key", client=client, field=f"meta.{key}")
        why = ms.problem(message.meta[key], message.meta)
        if why is not None:
            raise UploadError(why, client=client, field=f"meta.{key}")


def _dim(d: Dim, meta: Mapping[str, Any]) -> int | None:
    """A spec dimension resolved against the upload's (already validated) metadata."""
    if d is None or isinstance(d, int):
        return d
    if isinstance(d, str):
        value = meta.get(d)
    else:
        items = meta.get(d[0])
        value = items[d[1]] if isinstance(items, list) and 0 <= d[1] < len(items) else None
    return value if _is_int(value) else -1  # -1 matches no size: the shape is refused


#: Bytes an upload may carry beyond its tensors: the safetensors header and metadata.
META_ALLOWANCE = 64 * 1024
_HEADER_PER_TENSOR = 128  # a generous bound on one tensor's entry in the safetensors header


def size_limit(spec: UploadSpec) -> int | None:
    """The most bytes an upload of ``spec`` may have: ``spec.max_bytes`` when
    set, else the exact tensor bytes of the spec (every shape and dtype known)
    plus :data:`META_ALLOWANCE`; ``None`` when a shape is open."""
    if spec.max_bytes is not None:
        return spec.max_bytes
    if spec.variants:  # the largest form
        limits = [size_limit(spec.variant(name)) for name in spec.variants]
        return None if any(x is None for x in limits) else max(limits)  # type: ignore[type-var]
    total = META_ALLOWANCE
    for name, ts in {**spec.tensors, **spec.optional}.items():
        if ts.shape is None or ts.dtype is None or not all(isinstance(d, int) for d in ts.shape):
            return None  # an open (or metadata-sized) dimension: no size known in advance
        numel = math.prod(int(d) for d in ts.shape if isinstance(d, int))
        total += numel * ts.dtype.itemsize + len(name.encode()) + _HEADER_PER_TENSOR
    return total


def receive(
    raw: bytes, spec: UploadSpec, *, client: int | str | None = None, limit: int | None = None
) -> Upload:
    """The one way an upload gets to a server: its size is checked on the raw
    bytes *before* parsing (``limit``, default :func:`size_limit`), then it is
    parsed (safetensors, never pickle) and validated against ``spec``.
    Anything wrong is an :class:`UploadError` naming the client and the field."""
    cap = limit if limit is not None else size_limit(spec)
    if cap is not None and len(raw) > cap:
        raise UploadError(
            f"{len(raw)} bytes exceeds the limit of {cap} for this upload", client=client, field="*"
        )
    upload = Upload.from_bytes(raw, client=client)
    validate(upload, spec, client=client)
    return upload


def spec_from_state_dict(
    state: Mapping[str, torch.Tensor], *, prefix: str = "", max_bytes: int | None = None
) -> UploadSpec:
    """An exact spec for uploading a model's state dict (same keys, shapes,
    dtypes); BatchNorm variances (``running_var``) must not be negative."""
    return UploadSpec(
        tensors={
            prefix + k: TensorSpec(
                tuple(v.shape),
                v.dtype,
                finite=v.is_floating_point(),
                low=0.0 if k.endswith("running_var") else None,
            )
            for k, v in state.items()
        },
        max_bytes=max_bytes,
    )


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: for tables and logs."""
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024**exp:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][exp]}"
