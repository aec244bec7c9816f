"""FuseFL (osfl.methods.fusefl): the block split, K rounds and their bytes,
the fused model, accuracy on the tiny task, refused options."""

from __future__ import annotations

import pytest
import torch

from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.fl.upload import Broadcast, Upload, validate
from osfl.methods.fusefl import FuseFL, split_model
from osfl.methods.fusefl.split import block_module
from osfl.models import create_model
from support.tiny import TINY

CLIENTS = 3


@pytest.mark.parametrize(("name", "ks"), [("cnn_small", (2, 3)), ("resnet18", (2, 3, 4, 5))])
def test_blocks_then_classifier_are_the_model(name, ks):
    model = create_model(name, num_classes=10, width=4).eval()
    x = torch.randn(2, 3, 16, 16)
    for k in ks:
        split = split_model(name, model, k)
        assert split.k == k
        z = x
        for paths in split.blocks:
            z = block_module(model, paths)(z)
        assert torch.allclose(model.get_submodule(split.head)(z), model(x), atol=1e-5)


def _run(tmp_path, *extra: str) -> dict[str, dict]:
    cfg = load_config(
        None,
        [
            *TINY,
            "train.epochs=8",
            "train.optimizer=sgdm",
            "train.lr=0.05",
            f"partition.num_clients={CLIENTS}",
            "methods=[ensemble,fusefl]",
            "eval_every=1",
            f"cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
    )
    return {r["method"]: r for r in run_experiment(cfg)}


def _bytes_per_round(record: dict) -> list[int]:
    sent = [p["bytes"] for p in record["curve"]]
    return [b - a for a, b in zip([0, *sent], sent, strict=False)]


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in state.values())


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("k3"), "method.fusefl.blocks=3")


def test_k_rounds_each_with_its_block_bytes(k3):
    """Round k: every client uploads adaptor k + block k (+ its classifier in
    the last round); from round 1 on, every client receives fused block k-1."""
    fuse, ens = k3["fusefl"], k3["ensemble"]
    assert fuse["rounds"] == 3 and len(fuse["curve"]) == 3
    assert fuse["uploads"] == "weights" and fuse["regime"] == "scratch"
    assert fuse["server"]["members_per_block"] == [CLIENTS] * 3

    method = _method("method.fusefl.blocks=3")  # the run's model: 1-channel digits
    ref = method._reference
    block = [_nbytes(method.block_state(ref, j)) for j in range(3)]
    head = _nbytes(ref.fc.state_dict())
    ch = method.channels[:2]
    assert ch == [8, 16]  # cnn_small(width=8): the widths the adaptors map back to
    adaptor = [0, (CLIENTS * ch[0] * ch[0] + ch[0]) * 4, (CLIENTS * ch[1] * ch[1] + ch[1]) * 4]
    per_round = _bytes_per_round(fuse)
    down0 = ens["bytes_down"]  # round 0 sends the common initial model, as Ensemble does
    up = [block[0], adaptor[1] + block[1], adaptor[2] + block[2] + head]
    down = [0, CLIENTS * (adaptor[0] + block[0]), CLIENTS * (adaptor[1] + block[1])]
    for r in range(3):
        payload = CLIENTS * up[r] + (down0 if r == 0 else CLIENTS * down[r])
        # + safetensors headers and metadata: a few hundred bytes per message
        assert payload <= per_round[r] <= payload + 6 * CLIENTS * 1024, (r, per_round, payload)
    # upload in all: one model per client + the adaptors (the paper's "no extra upload")
    model_up = ens["bytes_up"]
    assert fuse["bytes_up"] >= model_up + CLIENTS * (adaptor[1] + adaptor[2])
    assert fuse["bytes_up"] <= model_up + CLIENTS * (adaptor[1] + adaptor[2] + 6 * 1024)


def test_the_fused_model_beats_chance_and_only_exists_at_the_end(k3):
    fuse = k3["fusefl"]
    assert fuse["global_test_accuracy"] > 0.1 + 0.3  # 10 classes: far above chance
    assert fuse.curve[0].global_test_accuracy < 0.25  # no classifier before round K
    assert fuse["server"]["fused_parameters"] > 2.5 * fuse["server"]["client_model_parameters"]


def _method(*extra: str) -> FuseFL:
    from osfl import assembly

    cfg = load_config(
        None,
        [*TINY, f"partition.num_clients={CLIENTS}", "methods=[fusefl]", "cache_dir=null", *extra],
    )
    splits = assembly.load_splits(cfg)
    ctx = assembly.seed_context(cfg, splits, cfg.seeds[0])
    return assembly.build_job(cfg, "fusefl", ctx).method


def test_fused_model_output_shape_and_upload_spec():
    method = _method()
    state = method.init_state()
    init = method.broadcast(state, 0)
    assert isinstance(init, Broadcast) and set(init.tensors) == set(state["init"])
    # fake uploads: the initial model's blocks (what a client that learnt nothing sends)
    ref = method._reference
    for r in range(method.rounds):
        ups = {}
        for c in range(CLIENTS):
            tensors = {f"block.{k}": v for k, v in method.block_state(ref, r).items()}
            if r > 0:
                a = method.new_adaptor(r, CLIENTS, torch.Generator().manual_seed(c))
                tensors.update({f"adaptor.{k}": v for k, v in a.state_dict().items()})
            if r == method.rounds - 1:
                tensors.update({f"head.{k}": v for k, v in ref.fc.state_dict().items()})
            ups[c] = Upload(tensors, {"num_samples": 10})
            validate(ups[c], method.upload_spec(state, r, c))
        state = method.aggregate(state, ups, r)
    pred = method.predictor(state).eval()
    x = torch.rand(5, *method.run.image_shape)
    assert pred(x).shape == (5, method.run.num_classes)
    assert len(pred.trunk.blocks) == 2 and len(pred.trunk.blocks[-1].blocks) == CLIENTS
    # a tensor of the wrong shape (an adaptor over too few streams) is refused
    bad = dict(ups[0].tensors)
    bad["adaptor.conv.weight"] = bad["adaptor.conv.weight"][:, :8]
    with pytest.raises(Exception, match=r"adaptor\.conv\.weight"):
        validate(Upload(bad, {"num_samples": 10}), method.upload_spec(state, 1, 0))


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"blocks": 1}, "blocks"),
        ({"adaptor": "mlp"}, "adaptor"),
        ({"classifier": "vote"}, "classifier"),
    ],
)
def test_bad_options_are_refused(bad, words):
    with pytest.raises(ConfigError, match=words):
        method_config(FuseFL, bad)


def test_unsupported_model_and_too_many_blocks_are_refused():
    with pytest.raises(ConfigError, match="blocks must be between 2 and 3"):
        _method("method.fusefl.blocks=4").check()
    with pytest.raises(ConfigError, match="supported models: cnn_small, resnet18"):
        _method("model.name=lenet5", "model.kwargs={}").check()
