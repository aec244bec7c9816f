"""Hostile uploads at the server's one door (property test, hypothesis): a
FedAvg round where three honest clients send their real uploads and three
others send generated bad ones — NaN/Inf, wrong shapes, dtypes, missing and
extra keys, updates scaled ×10⁶, zero, negative or absurd sample counts,
truncated or corrupted safetensors bytes, metadata that is not JSON or of the
wrong type, metadata or a header nested thousands of levels deep (``json``
would recurse past Python's limit), arbitrary bytes. Every bad upload is that
client's refusal with a reason naming the client and the field, nothing is
raised, and the aggregate of the round equals the aggregate of the honest
uploads alone (to 1e-6).
400 examples × 3 bad uploads: 1,200 bad uploads per run of the fast suite."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from osfl import assembly
from osfl.config import load_config
from osfl.errors import UploadError
from osfl.fl.method import MethodWrapper, Screening
from osfl.fl.observers import Observers
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.rounds import Inbox
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import META_KEY, Upload
from support.tiny import TINY_FUZZ

HONEST = (0, 1, 2)
HOSTILE = (3, 4, 5)
#: An update norm no honest client of this task comes near (theirs are ~3-10).
MAX_UPDATE_NORM = 1e3


class Round0:
    """A FedAvg round's server side, its state and the honest clients' upload
    bytes (a short ``repr``: hypothesis prints its arguments)."""

    def __init__(self, loop: Inbox, state: Any, honest: dict[int, bytes]):
        self.loop, self.state, self.honest = loop, state, honest

    def __iter__(self) -> Any:
        return iter((self.loop, self.state, self.honest))

    def __repr__(self) -> str:
        return "Round0(fedavg, 6 clients)"


@pytest.fixture(scope="module")
def round0() -> Round0:
    """A 6-client FedAvg job, its initial state and the honest clients' upload bytes."""
    cfg = load_config(
        None,
        [*TINY_FUZZ, "methods=[fedavg]", "train.epochs=1", "cache_dir=null"],
    )
    cfg = dataclasses.replace(cfg, server=ServerConfig(max_update_norm=MAX_UPDATE_NORM))
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    job = assembly.build_job(cfg, "fedavg", ctx)
    loop = Inbox(job, Observers([]), checkpoints=None)  # the server's receiving side
    state = job.method.init_state()
    payload = job.method.broadcast(state, 0).to_bytes()
    from osfl.fl.runtime.client import run_client

    honest = {
        c: run_client(
            job.method,
            job.run,
            client=c,
            round=0,
            seed=0,
            payload=payload,
            data=job.clients.data(c),
        ).upload
        for c in HONEST
    }
    return Round0(loop, state, honest)  # type: ignore[arg-type]


def _bad_tensors(
    kind: str, tensors: dict[str, torch.Tensor], key: str, data: Any
) -> dict[str, torch.Tensor]:
    t = dict(tensors)
    v = t[key]
    if kind == "nan":
        w = v.clone().float()
        w.view(-1)[data.draw(INDEX) % w.numel()] = data.draw(
            st.sampled_from([float("nan"), float("inf"), float("-inf")])
        )
        t[key] = w.to(v.dtype) if v.is_floating_point() else w
    elif kind == "shape":
        t[key] = (
            torch.zeros(*v.shape, 2) if data.draw(st.booleans()) else v.reshape(-1)[:-1].clone()
        )
    elif kind == "dtype":
        t[key] = v.to(torch.float64 if v.dtype != torch.float64 else torch.float32)
    elif kind == "missing":
        del t[key]
    elif kind == "extra":
        t[data.draw(st.sampled_from(["evil", key + ".x", "__init__"]))] = torch.zeros(2)
    elif kind == "scale":
        t = {k: w * 1e6 if w.is_floating_point() else w for k, w in t.items()}
    return t


#: Positions are drawn from one fixed range and reduced modulo the size, so the
#: strategy never depends on the data (hypothesis replays draws exactly).
INDEX = st.integers(0, 2**31 - 1)
KINDS = [
    "nan",
    "shape",
    "dtype",
    "missing",
    "extra",
    "scale",
    "count",
    "meta_type",
    "meta_json",
    "truncate",
    "flip",
    "garbage",
    "nested_meta",
    "nested_header",
]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def bad_upload(honest: bytes, data: Any) -> tuple[bytes, str]:
    """A hostile variant of ``honest`` and what was done to it."""
    up = Upload.from_bytes(honest)
    kind = data.draw(st.sampled_from(KINDS))
    key = data.draw(st.sampled_from(sorted(up.tensors)))
    if kind in ("nan", "shape", "dtype", "missing", "extra", "scale"):
        floats = [k for k, v in up.tensors.items() if v.is_floating_point() and v.numel() > 1]
        key = data.draw(st.sampled_from(floats)) if kind in ("nan", "scale") else key
        return Upload(_bad_tensors(kind, up.tensors, key, data), up.meta).to_bytes(), kind
    if kind == "count":
        n = data.draw(st.sampled_from([0, -1, -(10**9), 10**18, 10**400]))
        return Upload(up.tensors, {**up.meta, "num_samples": n}).to_bytes(), kind
    if kind == "meta_type":
        value = data.draw(st.sampled_from(["7", 7.5, True, None, [7], {"n": 7}, float("nan")]))
        if isinstance(value, float) and value != value:  # NaN: only reachable by hand-made JSON
            raw = save(dict(up.tensors), metadata={META_KEY: '{"num_samples": NaN}'})
            return raw, kind
        extra = data.draw(st.booleans())
        meta = {**up.meta, "flops": value} if extra else {**up.meta, "num_samples": value}
        return Upload(up.tensors, meta).to_bytes(), kind
    if kind == "meta_json":
        junk = data.draw(st.sampled_from(["{bad", "[1, 2]", '"text"', "", "{'a': 1}"]))
        return save(
            {k: v.contiguous() for k, v in up.tensors.items()}, metadata={META_KEY: junk}
        ), kind
    if kind == "nested_meta":  # about 2 KB at depth 1,000: once enough to end the round
        depth = data.draw(st.sampled_from([17, 100, 999, 1000, 5000, 100_000]))
        meta = json.dumps(up.meta)[:-1] + f', "z": {nested(depth)}}}'
        tensors = {k: v.contiguous() for k, v in up.tensors.items()}
        return save(tensors, metadata={META_KEY: meta}), kind
    if kind == "nested_header":  # the safetensors header itself
        depth = data.draw(st.sampled_from([17, 1000, 100_000]))
        header = f'{{"__metadata__": {{}}, "w": {nested(depth)}}}'.encode()
        return len(header).to_bytes(8, "little") + header, kind
    raw = bytearray(honest)
    if kind == "truncate":
        return bytes(raw[: data.draw(INDEX) % len(raw)]), kind
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 16))):
            i = data.draw(INDEX) % min(len(raw), 2000)  # the header and first values
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        return bytes(raw), kind
    return data.draw(st.binary(min_size=0, max_size=300)), kind


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_bad_uploads_are_refused_and_leave_the_aggregate_of_the_good(round0, data) -> None:
    loop, state, honest = round0
    turns = {c: ClientTurn(upload=honest[c], state=None) for c in HONEST}
    made = {}
    for c in HOSTILE:
        raw, kind = bad_upload(honest[HONEST[c % 3]], data)
        made[c] = kind
        turns[c] = ClientTurn(upload=raw, state=None)
    got = loop.receive(state, 0, turns)
    uploads, refused = got.uploads, got.refused
    # a flipped bit may land where it changes nothing the server reads: such an upload is honest
    accepted_bad = [c for c in HOSTILE if c in uploads]
    for c in accepted_bad:
        assert made[c] == "flip", f"client {c}: a {made[c]} upload was accepted"
    for c in HOSTILE:
        if c in refused:
            why = refused[c]
            assert why.startswith(f"[client {c}, field "), (made[c], why)
    good = {c: uploads[c] for c in HONEST}
    assert set(HONEST) <= set(uploads)
    method = loop.method
    if not accepted_bad:
        mixed = method.aggregate(state, uploads, 0)
        alone = method.aggregate(state, good, 0)
        for k, v in alone.items():
            assert torch.allclose(mixed[k].double(), v.double(), atol=1e-6, rtol=0), k


def test_each_kind_of_bad_upload_is_named_by_its_field(round0) -> None:
    """One hand-made upload per kind, with the reason the server gives."""
    loop, state, honest = round0
    up = Upload.from_bytes(honest[0])
    key = next(k for k, v in up.tensors.items() if v.is_floating_point() and v.ndim > 1)
    cases = {
        "nan": (Upload({**up.tensors, key: up.tensors[key] * float("nan")}, up.meta), key),
        "scale": (
            Upload(
                {k: v * 1e6 if v.is_floating_point() else v for k, v in up.tensors.items()}, up.meta
            ),
            "*",
        ),
        "zero count": (Upload(up.tensors, {**up.meta, "num_samples": 0}), "meta.num_samples"),
        "huge count": (Upload(up.tensors, {**up.meta, "num_samples": 10**18}), "meta.num_samples"),
        "extra meta": (Upload(up.tensors, {**up.meta, "flops": "x"}), "meta.flops"),
    }
    for name, (bad, field) in cases.items():
        with pytest.raises(UploadError) as info:
            loop.accept(state, 0, 0, bad.to_bytes())
        assert info.value.client == 0, name
        assert info.value.field == field or (
            field == "*" and "max_update_norm" in str(info.value)
        ), (
            name,
            str(info.value),
        )
    with pytest.raises(UploadError, match="metadata is not JSON") as info:
        loop.accept(
            state,
            0,
            4,
            save({k: v.contiguous() for k, v in up.tensors.items()}, metadata={META_KEY: "{bad"}),
        )
    assert info.value.field == "meta"
    with pytest.raises(UploadError, match="not a valid safetensors") as info:
        loop.accept(state, 0, 0, up.to_bytes()[:100])
    assert info.value.field == "*"
    assert json.loads(json.dumps(info.value.field)) == "*"


class _CrashingScreen(MethodWrapper, Screening):
    """A screen with a bug for client 2 (what a hostile upload might trip)."""

    def screen(self, state: Any, round: int, client: int, upload: Upload) -> str | None:
        if client == 2:
            raise RecursionError("maximum recursion depth exceeded")
        return None


def test_any_exception_on_one_upload_is_that_clients_refusal(round0) -> None:
    loop, state, honest = round0
    job = dataclasses.replace(loop.job, method=_CrashingScreen(loop.job.method))
    inbox = Inbox(job, Observers([]), checkpoints=None)
    got = inbox.receive(state, 0, {c: ClientTurn(upload=honest[c], state=None) for c in HONEST})
    assert got.accepted == [0, 1]
    assert got.refused[2].startswith("[client 2, field '*'] RecursionError while checking it")
    assert got.bytes_refused == len(honest[2]) and set(got.bytes_up) == {0, 1}
