"""Aggregation cannot raise on an upload that passed validation (property test
over the method registry). Every registered method runs its smoke task up to
its first aggregation; hypothesis then drives ``aggregate`` with uploads made
extreme but still valid: float tensors at ``±finfo.max``, scaled by 1e30,
sign-flipped, zero or huge noise; ``num_samples`` at either end of its
bound. Each variant goes through the server's own door (size, spec, screen:
``Inbox.accept``); whatever it lets in, ``aggregate`` and ``predictor``
must take without raising (the result may be useless: that is what the robust
aggregators and the evaluator's non-finite flag are for).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.errors import UploadError
from osfl.fl.method import METHODS
from osfl.fl.observers import Observers
from osfl.fl.runtime.rounds import Inbox
from osfl.fl.upload import Upload
from support.smoke import first_aggregation, smoke_config, smoke_context


def _extreme(t: torch.Tensor, kind: str) -> torch.Tensor:
    if not t.is_floating_point() or t.numel() == 0:
        return t
    big = torch.finfo(t.dtype).max
    gen = torch.Generator().manual_seed(t.numel())
    return {
        "keep": lambda: t,
        "max": lambda: torch.full_like(t, big),
        "neg_max": lambda: torch.full_like(t, -big),
        "scale": lambda: t * 1e30,
        "flip": lambda: -t * 1e10,
        "zero": lambda: torch.zeros_like(t),
        "noise": lambda: torch.randn(t.shape, generator=gen).to(t.dtype) * 1e20,
    }[kind]()


KINDS = ["keep", "max", "neg_max", "scale", "flip", "zero", "noise"]
_CAPTURED: dict[str, tuple[Any, Any, dict[int, Upload]]] = {}


def _captured(name: str) -> tuple[Any, Any, dict[int, Upload]]:
    """(job, server state before round 0's aggregation, round 0's uploads)."""
    if name not in _CAPTURED:
        cfg = smoke_config(name)
        job = assembly.build_job(cfg, name, smoke_context(cfg))
        state, uploads = first_aggregation(job)
        _CAPTURED[name] = (job, state, uploads)
    return _CAPTURED[name]


def _check(name: str, data: st.DataObject) -> None:
    job, state, uploads = _captured(name)
    loop = Inbox(job, Observers([]), checkpoints=None)  # the server's receiving side
    accepted: dict[int, Upload] = {}
    for c, up in uploads.items():
        kind = data.draw(st.sampled_from(KINDS), label=f"client {c}")
        meta = dict(up.meta)
        if "num_samples" in meta:
            high = loop.spec_for(state, 0, c).meta["num_samples"].high
            meta["num_samples"] = data.draw(st.sampled_from([1, int(high or 1)]))
        extreme = Upload({k: _extreme(v, kind) for k, v in up.tensors.items()}, meta)
        try:
            accepted[c] = loop.accept(state, 0, c, extreme.to_bytes())
        except UploadError:
            continue  # refused at the door: never reaches aggregate
    if not accepted:
        return
    method = job.method
    new = method.aggregate(copy.deepcopy(state), accepted, 0)
    method.predictor(new)


@pytest.mark.parametrize("name", METHODS.names())
@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_aggregate_takes_any_valid_upload(name: str, data: st.DataObject) -> None:
    torch.set_num_threads(1)
    _check(name, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS.names())
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_aggregate_takes_many_valid_uploads(name: str, data: st.DataObject) -> None:
    torch.set_num_threads(1)
    _check(name, data)
