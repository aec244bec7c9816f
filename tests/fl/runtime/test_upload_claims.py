"""The bounds the server holds each client to, by value, at the one door
every individual upload takes (``osfl.fl.runtime.rounds.Inbox``).

A client declares things about itself (its sample count, the size of what
it sends, how far its model moved); the server checks each claim against a
limit *it* knows:

- ``meta.num_samples`` at most the client's own partition size in a
  rehearsal (four clients of four different sizes: another client's bound,
  the largest one or none would let a claim through, or refuse an honest
  one), else ``server.max_num_samples``; exactly the bound passes, one more
  is refused naming the field;
- the raw bytes at most the smaller of the spec's own size and
  ``server.max_upload_bytes`` (each of the two binding in turn);
- with ``server.max_update_norm``, the update (the upload minus the
  broadcast), not the weights, at most that norm: a model far from zero
  whose update is just inside the bound passes, just outside it is refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from osfl import assembly
from osfl.config import load_config
from osfl.errors import UploadError
from osfl.fl.observers import Observers
from osfl.fl.runtime.rounds import Inbox
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import Upload, size_limit
from support.tiny import TINY

CLIENTS = 4


def _job(server: ServerConfig | None = None) -> Any:
    cfg = load_config(
        None,
        [
            *TINY,
            f"partition.num_clients={CLIENTS}",
            "methods=[fedavg]",
            "train.epochs=1",
            "cache_dir=null",
        ],
    )
    if server is not None:
        cfg = dataclasses.replace(cfg, server=server)
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    return assembly.build_job(cfg, "fedavg", ctx)


@pytest.fixture(scope="module")
def job() -> Any:
    return _job()


def _raw(tensors: dict[str, torch.Tensor], **meta: Any) -> bytes:
    return Upload(dict(tensors), dict(meta)).to_bytes()


def test_a_client_s_sample_count_is_bounded_by_its_own_partition(job: Any) -> None:
    inbox = Inbox(job, Observers([]), checkpoints=None)
    state = job.method.init_state()
    sizes = {c: job.clients.size(c) for c in range(CLIENTS)}
    assert len(set(sizes.values())) == CLIENTS  # each client's bound is its own
    for c, n in sizes.items():
        assert inbox.accept(state, 0, c, _raw(state, num_samples=n)).meta["num_samples"] == n
        with pytest.raises(UploadError, match=rf"{n + 1} lies outside \[1, {n}\]") as info:
            inbox.accept(state, 0, c, _raw(state, num_samples=n + 1))
        assert (info.value.client, info.value.field) == (c, "meta.num_samples")


def test_without_a_known_size_the_bound_is_server_max_num_samples(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real sites: the server holds no partition, so ``server.max_num_samples``
    is the one bound (one client cannot claim the weight of the federation)."""
    run = dataclasses.replace(job.run, server=ServerConfig(max_num_samples=50))
    sites = dataclasses.replace(job, run=run)
    monkeypatch.setattr(sites.clients, "size", lambda c: None)
    inbox = Inbox(sites, Observers([]), checkpoints=None)
    state = job.method.init_state()
    for c in (0, CLIENTS - 1):
        inbox.accept(state, 0, c, _raw(state, num_samples=50))
        with pytest.raises(UploadError, match=r"51 lies outside \[1, 50\]"):
            inbox.accept(state, 0, c, _raw(state, num_samples=51))


def test_the_byte_limit_is_the_smaller_of_the_spec_s_and_the_server_s(job: Any) -> None:
    state = job.method.init_state()
    raw = _raw(state, num_samples=job.clients.size(1))
    spec_limit = size_limit(job.method.upload_spec(state, 0, 1))
    assert spec_limit is not None and len(raw) < spec_limit

    def inbox(max_upload_bytes: int) -> Inbox:
        run = dataclasses.replace(job.run, server=ServerConfig(max_upload_bytes=max_upload_bytes))
        return Inbox(dataclasses.replace(job, run=run), Observers([]), checkpoints=None)

    inbox(len(raw)).accept(state, 0, 1, raw)  # exactly the server's cap passes
    with pytest.raises(UploadError, match=rf"exceeds the limit of {len(raw) - 1}\b"):
        inbox(len(raw) - 1).accept(state, 0, 1, raw)  # the server's cap binds
    padded = Upload(dict(state), {"num_samples": 3, "pad": "x" * (spec_limit - len(raw) + 1)})
    with pytest.raises(UploadError, match=rf"exceeds the limit of {spec_limit}\b"):
        inbox(10 * spec_limit).accept(state, 0, 1, padded.to_bytes())  # the spec's binds


def test_the_update_norm_bound_is_on_the_update_not_the_weights() -> None:
    bound = 0.5
    job = _job(ServerConfig(max_update_norm=bound))
    inbox = Inbox(job, Observers([]), checkpoints=None)
    state = job.method.init_state()
    weights_norm = math.sqrt(
        sum(float(v.double().pow(2).sum()) for v in state.values() if v.is_floating_point())
    )
    assert weights_norm > 10 * bound  # the weights alone are far beyond the bound
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel() >= 4)
    direction = torch.zeros_like(state[key])
    direction.view(-1)[:4] = 0.5  # a unit vector on four entries
    n = job.clients.size(2)
    inside = {**state, key: state[key] + 0.9 * bound * direction}
    inbox.accept(state, 0, 2, _raw(inside, num_samples=n))
    outside = {**state, key: state[key] + 1.1 * bound * direction}
    with pytest.raises(UploadError, match=r"update norm 0\.55 exceeds server.max_update_norm 0\.5"):
        inbox.accept(state, 0, 2, _raw(outside, num_samples=n))
