"""The server's result does not depend on the order in which it decodes or
receives anything (issue 55), for every registered aggregation rule and every
registered method (timm-style: parametrised over the registries, so a new rule
or method is covered without a new test).

The uploads are the real ones: each method's smoke task runs to its first
aggregation (:func:`support.smoke.first_aggregation`), and every upload is
serialised with the real :class:`~osfl.fl.upload.Upload` encoding and decoded
from those bytes, as the server's inbox does. Then:

- **key order**: every decoded upload's tensors (and metadata) in another
  order: ``aggregate``, ``screen`` and ``aggregate_mean`` give bit-identical
  results;
- **client order**: the uploads arriving in another order of clients:
  ``aggregate`` gives the same result, up to float rounding.

The rules are driven the same way on a larger federation (six clients, two
with tied scores), through :func:`~osfl.fl.aggregators.aggregate_states`. The
decoder's own order is pinned too: a payload whose safetensors header lists
its tensors in another order decodes to the same, sorted, dict.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Mapping
from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.fl.aggregators import AGGREGATORS, aggregate_states, draw_seed
from osfl.fl.method import METHODS, Screening, SecureAggregation, capability, secure_weighting_of
from osfl.fl.secagg_config import SECURE_WEIGHTINGS
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import Upload
from support.smoke import first_aggregation, one_torch_thread, smoke_config, smoke_context  # noqa: F401  (an autouse fixture)

# --------------------------------------------------------------------------- helpers
#: The key under which a server state keeps wall-clock times (the
#: distillation servers' ``phases.seconds``): a measurement, not a result.
WALL_CLOCK = "seconds"


def bits(t: torch.Tensor) -> bytes:
    """A tensor's exact bytes (NaN payloads and signed zeros included)."""
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def assert_identical(a: Any, b: Any, where: str = "state") -> None:
    """``a`` and ``b`` hold the same structure and the same bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert bits(a) == bits(b), where
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
        return
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), where
        for k in a:
            if k != WALL_CLOCK:
                assert_identical(a[k], b[k], f"{where}[{k!r}]")
        return
    if isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
        return
    if isinstance(a, float) and a != a:  # NaN
        assert isinstance(b, float) and b != b, where
        return
    assert type(a) is type(b) and a == b, where


def assert_close(a: Any, b: Any, where: str = "state") -> None:
    """The same structure; floats equal up to float rounding, the rest exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and (a.dtype, a.shape) == (b.dtype, b.shape), where
        if a.is_floating_point():
            assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7, equal_nan=True), (
                where
            )
        else:
            assert torch.equal(a, b), where
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_close(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
        return
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), where
        for k in a:
            if k != WALL_CLOCK:
                assert_close(a[k], b[k], f"{where}[{k!r}]")
        return
    if isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]")
        return
    if isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-7, nan_ok=True), where
        return
    assert a == b, where


def shuffled(d: Mapping[Any, Any], rng: random.Random) -> dict[Any, Any]:
    """``d`` with its keys in another order (never the sorted one when it can)."""
    keys = list(d)
    for _ in range(5):
        rng.shuffle(keys)
        if len(keys) < 2 or keys != sorted(keys, key=str):
            break
    return {k: d[k] for k in keys}


def keys_shuffled(up: Upload, rng: random.Random) -> Upload:
    """The same upload, its tensors and its metadata held in another order."""
    return Upload(tensors=shuffled(up.tensors, rng), meta=shuffled(up.meta, rng))


def decoded(uploads: Mapping[int, Upload]) -> dict[int, Upload]:
    """Each upload as the server holds it: its real bytes, decoded."""
    return {c: Upload.from_bytes(up.to_bytes(), client=c) for c, up in uploads.items()}


def reordered_payload(raw: bytes, rng: random.Random) -> bytes:
    """The same safetensors message with its header's tensor entries listed in
    another order (the data offsets untouched): bytes another encoder may send."""
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    text = json.dumps(shuffled(header, rng), separators=(",", ":")).encode()
    text += b" " * (n - len(text))  # the same length: the offsets stay valid
    assert len(text) == n
    return raw[:8] + text + raw[8 + n :]


# --------------------------------------------------------------------------- decoding
def test_a_message_decodes_to_the_same_sorted_dict_whatever_its_header_order() -> None:
    """safetensors hands back its tensors in an order that changes from one
    load to the next; the decoder sorts them, so every decoding of a message
    (or of a message another encoder laid out differently) is the same dict."""
    gen = torch.Generator().manual_seed(0)
    up = Upload(
        tensors={f"layer{i}.w": torch.randn(3, generator=gen) for i in range(20)},
        meta={"num_samples": 4, "b": 1, "a": 2},
    )
    raw = up.to_bytes()
    rng = random.Random(0)
    for _ in range(10):
        for payload in (raw, reordered_payload(raw, rng)):
            got = Upload.from_bytes(payload)
            assert list(got.tensors) == sorted(up.tensors)
            assert_identical(got.tensors, up.tensors)
            assert got.meta == up.meta


# --------------------------------------------------------------------------- the rules
SHAPES = {
    "conv1.weight": (8, 3, 3, 3),
    "conv1.bias": (8,),
    "conv2.weight": (16, 8, 3, 3),
    "conv2.bias": (16,),
    "bn.weight": (16,),
    "bn.bias": (16,),
    "fc1.weight": (64, 200),
    "fc1.bias": (64,),
    "fc2.weight": (10, 640),
    "fc2.bias": (10,),
}


def _rule_uploads() -> dict[int, Upload]:
    """Six clients' model states (three layers, a BatchNorm counter) around a
    broadcast, decoded from their bytes. Clients 11 and 4 hold the same
    weights with different sample counts (their Krum scores tie: which one
    Multi-Krum keeps changes the mean); client 7 is far from the others."""
    gen = torch.Generator().manual_seed(5)
    base = _reference()
    ids = [3, 11, 4, 7, 0, 9]
    twin = {k: v + torch.randn(v.shape, generator=gen) * 0.05 for k, v in base.items()}
    out = {}
    for i, c in enumerate(ids):
        state = {k: v + torch.randn(v.shape, generator=gen) * 0.05 for k, v in base.items()}
        if c in (11, 4):
            state = dict(twin)
        if c == 7:
            state = {k: v + 3.0 for k, v in state.items()}
        state["bn.num_batches_tracked"] = torch.tensor(10 * (i + 1), dtype=torch.long)
        out[c] = Upload(tensors=state, meta={"num_samples": 10 + 3 * i})
    return decoded(out)


def _reference() -> dict[str, torch.Tensor]:
    """The broadcast: ten tensors, 20,698 float coordinates (more than DnC's
    10,000 a draw)."""
    gen = torch.Generator().manual_seed(5)
    return {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}


def _combine(rule: str, uploads: Mapping[int, Upload], reference: Any) -> dict[str, torch.Tensor]:
    clients = list(uploads)
    params = ServerConfig(aggregator=rule, byzantine=1)
    return aggregate_states(
        [uploads[c].tensors for c in clients],
        [uploads[c].meta["num_samples"] for c in clients],
        params,
        rule=rule,
        reference=reference,
        clients=clients,
        seed=draw_seed(0, 3),
    )


@pytest.mark.parametrize("rule", AGGREGATORS.names())
@pytest.mark.parametrize("with_reference", [True, False])
def test_every_rule_ignores_the_order_of_keys_and_of_clients(
    rule: str, with_reference: bool
) -> None:
    """Shuffled keys in every upload, and the clients in every other order
    tried: the same state, bit for bit (the rule combines in the order of the
    client ids, so a tie goes to the lower id, not to whoever came first)."""
    uploads = _rule_uploads()
    reference = _reference() if with_reference else None
    want = _combine(rule, uploads, reference)
    assert list(want) == sorted(want)
    rng = random.Random(rule)
    for _ in range(4):
        keys = {c: keys_shuffled(up, rng) for c, up in uploads.items()}
        assert_identical(_combine(rule, keys, reference), want)
        order = shuffled(keys, rng)
        assert_identical(_combine(rule, order, reference), want)


def test_a_krum_tie_goes_to_the_lower_client_id_whatever_the_order() -> None:
    """Five one-hot states: every pairwise distance is the same, so every
    Krum score ties. Krum keeps client 1's state, and Multi-Krum (m = n − f
    = 4) leaves out client 8's, in whatever order they arrive."""
    ids = [5, 2, 8, 1, 6]
    raw = {c: Upload({"w": torch.eye(5)[i]}, {"num_samples": 1}) for i, c in enumerate(ids)}
    uploads = decoded(raw)
    rng = random.Random(1)
    for _ in range(4):
        order = shuffled(uploads, rng)
        assert_identical(_combine("krum", order, None), {"w": torch.eye(5)[ids.index(1)]})
        kept = [ids.index(c) for c in (1, 2, 5, 6)]
        want = torch.eye(5, dtype=torch.float64)[kept].mean(dim=0).float()
        assert torch.equal(_combine("multi_krum", order, None)["w"], want)


# --------------------------------------------------------------------------- the methods
_CAPTURED: dict[str, tuple[Any, Any, dict[int, Upload]]] = {}


def _captured(name: str) -> tuple[Any, Any, dict[int, Upload]]:
    """(job, server state before round 0's aggregation, its uploads decoded
    from their bytes)."""
    if name not in _CAPTURED:
        cfg = smoke_config(name)
        job = assembly.build_job(cfg, name, smoke_context(cfg))
        state, uploads = first_aggregation(job)
        _CAPTURED[name] = (job, state, decoded(uploads))
    return _CAPTURED[name]


def _secure_mean(method: Any, uploads: Mapping[int, Upload]) -> Upload:
    """The uploads' weighted mean, as SecAgg+ hands it to the server."""
    rule = SECURE_WEIGHTINGS.get(secure_weighting_of(method))
    w = {c: float(rule.weight(u)) for c, u in uploads.items()}
    total = sum(w.values())
    first = uploads[min(uploads)].tensors
    tensors = {}
    for k in sorted(first):
        acc = sum(w[c] * uploads[c].tensors[k].double() for c in sorted(uploads)) / total
        tensors[k] = (
            acc.to(first[k].dtype)
            if first[k].is_floating_point()
            else acc.round().to(first[k].dtype)
        )
    return Upload(tensors=tensors, meta={"num_samples": int(total)})


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_ignores_the_order_of_keys_and_of_clients(name: str) -> None:
    """``aggregate`` (and ``screen``, ``aggregate_mean`` where the method has
    them) on the real decoded uploads: bit-identical with every upload's keys
    in another order; the same up to float rounding with the clients in
    another order."""
    job, state, uploads = _captured(name)
    method = job.method
    rng = random.Random(name)
    want = method.aggregate(copy.deepcopy(state), uploads, 0)

    keys = {c: keys_shuffled(up, rng) for c, up in uploads.items()}
    assert_identical(method.aggregate(copy.deepcopy(state), keys, 0), want)

    clients = dict(reversed(list(uploads.items())))
    assert list(clients) != list(uploads) or len(uploads) < 2
    assert_close(method.aggregate(copy.deepcopy(state), clients, 0), want)

    screening = capability(method, Screening)
    if screening is not None:
        for c, up in uploads.items():
            assert screening.screen(state, 0, c, keys[c]) == screening.screen(state, 0, c, up)

    secure = capability(method, SecureAggregation)
    if secure is not None and secure_weighting_of(method) is not None:
        mean = _secure_mean(method, uploads)
        assert_identical(
            secure.aggregate_mean(copy.deepcopy(state), keys_shuffled(mean, rng), 0),
            secure.aggregate_mean(copy.deepcopy(state), mean, 0),
        )
