"""The parameter-efficient FedAvg baselines: exactly the chosen parameters train
(the frozen ones stay bit-identical), uploads and specs hold exactly them,
aggregation averages over the clients that hold a tensor, FedRA's random
allocation and FEDBFPT's stages, costs, and pretrained starting points."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientContext
from osfl.fl.method import METHODS
from osfl.fl.upload import Upload, validate
from osfl.methods.peft import FedBFPT, FedRA, PEFTMethod, bfpt_stage, holder_average
from osfl.models import create_model
from support.smoke import SMALL_VIT_SPLIT

BASE = (
    *SMALL_VIT_SPLIT,
    "train.epochs=1",
    "train.batch_size=16",
    "cache_dir=null",
    "seeds=[0]",
)
_SPLITS: dict[str, Any] = {}


def method(name: str, *extra: str) -> tuple[PEFTMethod, Any]:
    cfg = load_config(None, [*BASE, f"methods=[{name}]", *METHODS.get(name).card.smoke, *extra])
    key = repr(cfg.data)
    if key not in _SPLITS:
        _SPLITS[key] = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, _SPLITS[key], 0)
    job = assembly.build_job(cfg, name, ctx)
    job.method.check()
    return job.method, job


def client_ctx(m: PEFTMethod, client: int = 0, round: int = 0) -> ClientContext:
    return ClientContext(m.run, client, round, torch.Generator().manual_seed(7))


EXPECTED = {
    "fedfull": lambda n: True,
    "fedhead": lambda n: n.startswith("head."),
    "fedbias": lambda n: n.endswith(".bias") or n.startswith("head."),
    "fedprompt": lambda n: n == "reg_token" or n.startswith("head."),
    "fedlora": lambda n: ".attn.qkv.lora_" in n or n.startswith("head."),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exactly_the_selected_parameters_train(name: str) -> None:
    m, job = method(name)
    state = m.init_state()
    data = job.clients.data(0)
    trained = m.train_client_model(client_ctx(m), m.broadcast(state, 0), data)
    base = m.build_model()
    m.load_global(base, state)  # adapters at their initial values
    before = dict(base.named_parameters())
    chosen = {n for n, _ in trained.named_parameters() if EXPECTED[name](n)}
    assert chosen and set(m.client_names(0, 0)) == chosen
    changed = set()
    for n, p in trained.named_parameters():
        if n in chosen:
            changed |= {n} if not torch.equal(p, before[n]) else set()
        else:
            assert torch.equal(p, before[n]), f"{name}: frozen {n} moved"
    assert any(n.startswith("head.") for n in changed), f"{name}: the head did not train"
    if name == "fedlora":
        assert any("lora_B" in n for n in changed)  # B leaves zero: the adapter is learning
    up = m.client_update(client_ctx(m), m.broadcast(state, 0), data)
    assert set(up.tensors) == chosen and up.meta == {"num_samples": len(data)}
    validate(up, m.upload_spec(state, 0, 0), client=0)
    assert set(m.broadcast(state, 0).tensors) == chosen  # the frozen base never travels


def test_fedlora_is_rank_8_alpha_8_on_q_and_v_of_every_block() -> None:
    m, _ = method("fedlora")
    assert (m.config.lora.rank, m.config.lora.alpha) == (8, 8.0)
    qkv = m.build_model().blocks[1].attn.qkv
    assert qkv.slices == (0, 2) and qkv.lora_A.shape[:2] == (2, 8)
    assert not any("lora" in n for n in m.trainable_names() if "attn.proj" in n or "mlp" in n)


def test_spec_refuses_frozen_tensors_and_wrong_shapes() -> None:
    m, _ = method("fedhead")
    state = m.init_state()
    spec = m.upload_spec(state, 0, 0)
    good = {k: v.clone() for k, v in state.items()}
    validate(Upload(tensors=good, meta={"num_samples": 5}), spec, client=0)
    bad_shape = {**good, "head.weight": torch.zeros(3, 3)}
    with pytest.raises(UploadError, match="shape"):
        validate(Upload(tensors=bad_shape, meta={"num_samples": 5}), spec, client=0)
    frozen = {**good, "blocks.0.attn.qkv.weight": torch.zeros(1)}
    with pytest.raises(UploadError, match="unexpected"):
        validate(Upload(tensors=frozen, meta={"num_samples": 5}), spec, client=0)


def test_aggregation_is_fedavg_over_the_uploaded_subset_only() -> None:
    m, _ = method("fedlora")
    state = m.init_state()
    a = {k: torch.full_like(v, 1.0) for k, v in state.items()}
    b = {k: torch.full_like(v, 4.0) for k, v in state.items()}
    new = m.aggregate(
        state,
        {
            0: Upload(tensors=a, meta={"num_samples": 10}),
            2: Upload(tensors=b, meta={"num_samples": 30}),
        },
        0,
    )
    assert set(new) == set(state)
    for v in new.values():
        torch.testing.assert_close(v, torch.full_like(v, 3.25))  # (10·1 + 30·4) / 40
    # a tensor only some clients hold: averaged over those; one nobody holds: kept
    avg = holder_average(
        {0: {"x": torch.ones(2), "y": torch.zeros(1)}, 1: {"x": torch.full((2,), 3.0)}},
        {0: 0.5, 1: 0.5},
    )
    torch.testing.assert_close(avg["x"], torch.full((2,), 2.0))
    torch.testing.assert_close(avg["y"], torch.zeros(1))


def test_global_model_keeps_the_frozen_base_bit_for_bit() -> None:
    m, _ = method("fedbias")
    state = {k: v + 1.0 for k, v in m.init_state().items()}
    model = m.global_model(state)
    base = m.base.state()
    for n, p in model.named_parameters():
        assert torch.equal(p, state[n] if n in state else base[n]), n


def test_fedra_allocation_spec_and_per_layer_average() -> None:
    m, job = method("fedra", "method.fedra.depths=[2,1]")
    assert isinstance(m, FedRA)
    alloc = m.allocation(0)
    assert alloc.shape == (3, 2) and alloc.sum(1).tolist() == [2, 1, 2]
    assert np.array_equal(alloc, m.allocation(0))  # a function of seed and round
    state = m.init_state()
    b = m.broadcast(state, 0)
    assert torch.equal(b.tensors["fedra.allocation"], torch.from_numpy(alloc))
    held = int(np.flatnonzero(alloc[1])[0])
    other = 1 - held
    names = m.client_names(0, 1)
    assert all(f"blocks.{other}." not in n for n in names)
    assert any(f"blocks.{held}.attn.proj.lora_A" == n for n in names)
    assert any("mlp.fc2.lora_B" in n for n in names) and "head.weight" in names
    up = m.client_update(client_ctx(m, 1), b, job.clients.data(1))
    assert set(up.tensors) == set(names)
    validate(up, m.upload_spec(state, 0, 1), client=1)
    intruder = Upload(
        tensors={
            **up.tensors,
            f"blocks.{other}.mlp.fc2.lora_A": state[f"blocks.{other}.mlp.fc2.lora_A"],
        },
        meta=up.meta,
    )
    with pytest.raises(UploadError, match="unexpected"):
        validate(intruder, m.upload_spec(state, 0, 1), client=1)
    # per block: the average over the clients that held it (uniform), others kept
    ups = {
        c: {n: torch.full_like(state[n], float(c + 1)) for n in m.client_names(0, c)}
        for c in range(3)
    }
    new = m.aggregate(
        state, {c: Upload(tensors=t, meta={"num_samples": 9}) for c, t in ups.items()}, 0
    )
    for layer in range(2):
        holders = [c for c in range(3) if alloc[c, layer]]
        key = f"blocks.{layer}.attn.proj.lora_B"
        expect = float(np.mean([c + 1 for c in holders])) if holders else None
        if expect is None:
            assert torch.equal(new[key], state[key])
        else:
            torch.testing.assert_close(new[key], torch.full_like(state[key], expect))
    torch.testing.assert_close(new["head.bias"], torch.full_like(state["head.bias"], 2.0))


def test_fedra_refuses_depths_beyond_the_model() -> None:
    with pytest.raises(ConfigError, match="exceed"):
        method("fedra", "method.fedra.depths=[12,10]")


def test_fedbfpt_stages_trainable_layer_and_sampled_deeper_layers() -> None:
    assert [bfpt_stage(r, 5) for r in range(5)] == [1, 1, 1, 2, 3]
    stages = [bfpt_stage(r, 100) for r in range(100)]
    assert stages[0] == 1 and stages[49] == 1 and stages[50] == 2 and stages[99] == 7
    assert stages == sorted(stages)
    m, job = method(
        "fedbfpt",
        "model.kwargs={patch_size: 4, depth: 4, embed_dim: 32, num_heads: 2}",
        "method.fedbfpt.rounds=4",
    )
    assert isinstance(m, FedBFPT)
    assert [m.stage(r) for r in range(4)] == [1, 1, 2, 3]
    names = m.client_names(2, 0)  # stage 2: block 1 and the head
    assert {n.split(".")[1] for n in names if n.startswith("blocks.")} == {"1"}
    assert "head.weight" in names and not any(n.startswith("patch_embed") for n in names)
    ctx = client_ctx(m, 0, 2)
    deeper = m.deeper_layers(ctx)
    assert len(deeper) == 4 - 2 and deeper == sorted(deeper) and all(2 <= d < 4 for d in deeper)
    view = m.client_view(ctx, m.build_model(), m.broadcast(m.init_state(), 2))
    assert view.block_ids[:2] == (0, 1)
    assert set(m.global_names(2)) >= set(names)  # blocks 0..d-1 and the head travel
    up = m.client_update(ctx, m.broadcast(m.init_state(), 2), job.clients.data(0))
    validate(up, m.upload_spec(m.init_state(), 2, 0), client=0)


def test_report_has_client_costs() -> None:
    m, _ = method("fedlora")
    rep = m.report(m.init_state())["client"]
    n_lora = sum(v.numel() for k, v in m.init_state().items() if "lora" in k)
    assert rep["trainable_parameters"] == n_lora + 64 * 10 + 10
    full, _ = method("fedfull")
    assert (
        rep["forward_gflops_per_image"]
        > full.report(full.init_state())["client"]["forward_gflops_per_image"]
    )
    ra, _ = method("fedra", "method.fedra.depths=[2,1]")
    by_depth = ra.report(ra.init_state())["client_by_depth"]
    assert set(by_depth) == {"1", "2"}
    assert by_depth["1"]["forward_gflops_per_image"] < by_depth["2"]["forward_gflops_per_image"]


def test_starts_from_a_pretrained_checkpoint(tmp_path) -> None:
    torch.manual_seed(3)
    vit = create_model(
        "vit_tiny_patch2_16",
        img_size=8,
        in_chans=1,
        patch_size=4,
        depth=2,
        embed_dim=64,
        num_heads=2,
        num_classes=100,
    )
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, str(path))
    m, _ = method("fedlora", f"model.kwargs.pretrained={path}")
    base = m.base.state()
    ckpt = vit.state_dict()
    for k, v in base.items():
        if not k.startswith("head."):  # 100 classes in the checkpoint, 10 here: head dropped
            assert torch.equal(v, ckpt[k]), k
    assert base["head.weight"].shape == (10, 64)


def test_client_costs_follow_the_round_and_the_client() -> None:
    """FedBFPT trains another block at each stage and FedRA another depth per
    client: the costs of (round, client) are those of the names that client
    trains in that round."""
    m, _ = method(
        "fedbfpt",
        "model.kwargs={patch_size: 4, depth: 4, embed_dim: 32, num_heads: 2}",
        "method.fedbfpt.rounds=4",
    )
    model = m.build_model()
    sizes = dict(model.named_parameters())
    for rnd in (0, 2, 3):
        costs = m.client_costs(rnd, 1)
        assert costs["trainable_parameters"] == sum(
            sizes[n].numel() for n in m.client_names(rnd, 1)
        )
    ra, _ = method("fedra", "method.fedra.depths=[2,1]")
    sizes = dict(ra.build_model().named_parameters())
    clients = range(ra.run.num_clients)
    counts = {c: ra.client_costs(1, c)["trainable_parameters"] for c in clients}
    assert counts == {c: sum(sizes[n].numel() for n in ra.client_names(1, c)) for c in clients}
    assert len(set(counts.values())) > 1  # the allocation differs between clients
    assert ra.client_costs(0, 0) != ra.client_costs(0, 1)
