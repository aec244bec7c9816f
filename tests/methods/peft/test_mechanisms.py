"""Mechanism tests of the parameter-efficient baselines that vary what a
client trains: FedRA's random layer allocation (Su, Li & Xue, ECCV 2024)
and FEDBFPT's progressive training with sampled deeper layers (Wang et al.,
IJCAI 2023). Frozen parameters stay bit-identical; the trained set follows
each paper's schedule. (Fed-Full/Head/Bias/Prompt/LoRA's trained sets:
tests/methods/peft/test_methods.py.) A 4-block ViT on the 8-px smoke digits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from osfl import assembly
from osfl.config import load_config
from osfl.fl.context import ClientContext
from osfl.fl.method import METHODS
from osfl.methods.peft.fedra import block_index
from support.smoke import BASE, smoke_context

DEEP = "model.kwargs={patch_size: 4, depth: 4, embed_dim: 32, num_heads: 2}"


def job_of(name: str, *extra: str) -> Any:
    cfg = load_config(
        None, [*BASE, *METHODS.get(name).card.smoke, f"methods=[{name}]", DEEP, *extra]
    )
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    job.method.check()
    return job


def client_ctx(job: Any, client: int, round: int) -> ClientContext:
    return ClientContext(job.run, client, round, torch.Generator().manual_seed(7))


def moved(job: Any, round: int, client: int, state: dict) -> set[str]:
    """The parameters that client ``client``'s local training in ``round`` changed."""
    m = job.method
    b = m.broadcast(state, round)
    trained = m.train_client_model(client_ctx(job, client, round), b, job.clients.data(client))
    start = m.build_model()
    m.load_global(start, m.model_tensors(b))
    before = dict(start.named_parameters())
    return {n for n, p in trained.named_parameters() if not torch.equal(p, before[n])}


@pytest.fixture(scope="module")
def fedra() -> Any:
    return job_of("fedra", "method.fedra.depths=[3,2]", "method.fedra.rounds=3", "train.epochs=1")


def test_fedra_allocation_is_random_over_rounds_and_clients(fedra) -> None:
    """FedRA's random allocation matrix (Su et al., ECCV 2024, §3.2): every
    round each client gets ``depth_i`` of the L blocks, drawn without
    replacement and anew each round, so the allocation varies over rounds
    and over clients of the same depth."""
    m = fedra.method
    allocations = [m.allocation(r) for r in range(3)]
    for a in allocations:
        assert a.shape == (3, 4) and a.sum(1).tolist() == [3, 2, 3]
    assert any(not np.array_equal(allocations[0], a) for a in allocations[1:])
    assert any(not np.array_equal(a[0], a[2]) for a in allocations)  # clients 0, 2: depth 3


def test_fedra_client_runs_and_trains_only_its_allocated_blocks(fedra) -> None:
    """A FedRA client's model is the stack of its allocated blocks (in their
    order); only those blocks' LoRA and the head train, and only they are
    uploaded; everything else stays bit for bit."""
    m = fedra.method
    state = m.init_state()
    for client in (1, 2):
        held = np.flatnonzero(m.allocation(1)[client]).tolist()
        b = m.broadcast(state, 1)
        view = m.client_view(client_ctx(fedra, client, 1), m.build_model(), b)
        assert list(view.block_ids) == held
        changed = moved(fedra, 1, client, state)
        assert changed and all(block_index(n) in held or n.startswith("head.") for n in changed)
        assert all("lora_" in n or n.startswith("head.") for n in changed)
        assert {block_index(n) for n in changed if "lora_B" in n} == set(held)
        up = m.client_update(client_ctx(fedra, client, 1), b, fedra.clients.data(client))
        assert {block_index(n) for n in up.tensors} - {None} == set(held)


@pytest.fixture(scope="module")
def fedbfpt() -> Any:
    return job_of("fedbfpt", "method.fedbfpt.rounds=4", "train.epochs=1")


def test_fedbfpt_trains_one_block_at_a_time_deeper_each_stage(fedbfpt) -> None:
    """FEDBFPT's progressive learning (Wang et al., IJCAI 2023, PL-SDL): at
    stage d only block d-1 and the head train (the shallower blocks are the
    global ones, frozen; the embeddings too), and d grows over the rounds."""
    m = fedbfpt.method
    assert [m.stage(r) for r in range(4)] == [1, 1, 2, 3]
    state = m.init_state()
    for r in (0, 2, 3):
        d = m.stage(r)
        changed = moved(fedbfpt, r, 0, state)
        assert {block_index(n) for n in changed} == {d - 1, None}
        assert all(block_index(n) == d - 1 or n.startswith("head.") for n in changed)
        assert set(m.global_names(r)) >= set(changed)


def test_fedbfpt_deeper_layers_are_sampled_above_the_stage_and_redrawn(fedbfpt) -> None:
    """PL-SDL's sampled deeper layers: a client's model is the global blocks
    0..d-1 followed by blocks drawn with replacement from [d, L), sorted, and
    drawn anew every round."""
    m = fedbfpt.method
    draws = []
    for r in range(4):
        d = m.stage(r)
        for c in range(3):
            ctx = client_ctx(fedbfpt, c, r)
            view = m.client_view(ctx, m.build_model(), m.broadcast(m.init_state(), r))
            ids = list(view.block_ids)
            assert ids[:d] == list(range(d)) and len(ids) == 4
            assert ids[d:] == sorted(ids[d:]) and all(d <= i < 4 for i in ids[d:])
            if d == 1:
                draws.append((r, c, tuple(ids[d:])))
    by_client = {c: {ids for r, cc, ids in draws if cc == c} for c in range(3)}
    assert any(len(v) > 1 for v in by_client.values())  # redrawn between rounds 0 and 1
    assert any(any(ids.count(i) > 1 for i in ids) for _, _, ids in draws)  # with replacement
