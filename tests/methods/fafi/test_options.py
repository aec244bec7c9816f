"""FAFI's options for the public code's recipe (``fafi_code``): raw-prototype scoring,
separate temperatures, raw prototype separation, data-size fusion, gradient clipping (a
local-training default of ``fafi_code``) and the crop scale. Values worked out by hand on
tiny tensors; one tiny digits run."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.assembly import build_federation, build_run, load_splits, method_run, train_recipe
from osfl.config import load_config, method_config
from osfl.data.transforms import Compose, RandomResizedCrop, simclr_pipeline
from osfl.errors import ConfigError
from osfl.fl.evaluate import evaluate
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from osfl.methods.fafi import (
    FAFI,
    FAFICode,
    FAFICodeConfig,
    FAFIConfig,
    FAFINet,
    IFFIPredictor,
    SaltLoss,
    contrastive_loss,
    prototype_loss,
    prototype_scores,
    prototype_separation_loss,
)
from osfl.models import create_model
from support.tiny import TINY_FAFI_CODE, TINY_FAFI_SKEWED


# --------------------------------------------------------------------------- losses
def test_unit_feature_scores_use_raw_prototypes() -> None:
    f = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    p = torch.tensor([[2.0, 0.0], [0.0, 10.0]])
    # (0.6, 0.8) and (0, 1) against the raw rows
    expect = torch.tensor([[1.2, 8.0], [0.0, 10.0]])
    torch.testing.assert_close(prototype_scores(f, p, similarity="unit_feature"), expect)
    torch.testing.assert_close(
        prototype_scores(f, p, similarity="cosine"), torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    )
    y = torch.tensor([1, 1])
    loss = prototype_loss(f, p, y, tau=1.0, denominator="all", similarity="unit_feature")
    torch.testing.assert_close(loss, F.cross_entropy(expect, y))
    with pytest.raises(ConfigError, match="unbounded"):
        prototype_loss(f, p, y, denominator="negatives", similarity="unit_feature")


def test_raw_separation_is_ce_of_p_pt() -> None:
    p = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])  # each its own nearest
    raw = prototype_separation_loss(p, tau=1.0, normalize=False)
    torch.testing.assert_close(raw, F.cross_entropy(p @ p.T, torch.arange(3)))
    cos = prototype_separation_loss(p, tau=0.5)
    q = F.normalize(p, dim=1)
    torch.testing.assert_close(cos, F.cross_entropy(q @ q.T / 0.5, torch.arange(3)))
    # raw separation also rewards larger norms (a larger logit scale lowers it)
    assert float(prototype_separation_loss(2 * p, tau=1.0, normalize=False)) < float(raw)


def test_salt_loss_code_recipe_by_hand() -> None:
    torch.manual_seed(0)
    net = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3)
    with torch.no_grad():
        net.prototypes.copy_(torch.randn(3, net.feature_dim))
    x, y = torch.randn(8, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    cfg = FAFICodeConfig()
    loss = cfg.loss(net, x, y)
    f = net.features(x)
    yy = torch.cat([y, y])
    expect = (
        contrastive_loss(f[:4], f[4:], y, tau=0.07, denominator="all")
        + 2.0 * F.cross_entropy(F.normalize(f, dim=1) @ net.prototypes.T, yy)
        + F.cross_entropy(net.prototypes @ net.prototypes.T, torch.arange(3))
    )
    torch.testing.assert_close(loss, expect)
    # separate temperatures: ssl_tau only moves L_ssl, proto_tau only L_proto
    a = SaltLoss(proto_weight=0.0, ssl_tau=0.2)(net, x, y)
    torch.testing.assert_close(a, contrastive_loss(f[:4], f[4:], y, tau=0.2))
    b = SaltLoss(ssl_weight=0.0, proto_tau=0.25)(net, x, y)
    torch.testing.assert_close(b, prototype_loss(f, net.prototypes, yy, tau=0.25))


# --------------------------------------------------------------------------- inference
def _linear(weight: list[list[float]]) -> nn.Module:
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(weight))
    return nn.Sequential(nn.Flatten(), lin)


def test_data_size_fusion_and_raw_scoring_by_hand() -> None:
    a = _linear([[1.0, 0.0], [0.0, 1.0]])
    b = _linear([[0.0, 1.0], [1.0, 0.0]])  # swaps the coordinates
    protos = torch.tensor([[1.0, 0.0], [0.0, 4.0]])
    x = torch.tensor([[[[3.0, 1.0]]]])
    pred = IFFIPredictor(
        [a, b], protos, fusion="data_size", client_weights=[3.0, 1.0], scoring="unit_feature"
    )
    fused = (3 * torch.tensor([3.0, 1.0]) + 1 * torch.tensor([1.0, 3.0])) / 4  # (2.5, 1.5)
    torch.testing.assert_close(pred.fused_features(x)[0], fused)
    unit = fused / fused.norm()
    torch.testing.assert_close(pred(x)[0], protos @ unit)  # raw prototypes: class 1 wins
    assert int(pred(x).argmax()) == 1
    cos = IFFIPredictor([a, b], protos, fusion="data_size", client_weights=[3.0, 1.0])
    assert int(cos(x).argmax()) == 0  # cosine ignores the prototype norm
    assert pred.last_weights is not None and pred.last_weights[:, 0].tolist() == [3.0, 1.0]
    with pytest.raises(ValueError, match="client weight"):
        IFFIPredictor([a, b], protos, fusion="data_size")
    with pytest.raises(ValueError, match="finite"):
        IFFIPredictor([a, b], protos, fusion="data_size", client_weights=[0.0, 0.0])
    with pytest.raises(ConfigError, match="scoring"):
        IFFIPredictor([a, b], protos, fusion="average", scoring="dot")


# --------------------------------------------------------------------------- config
def test_code_variant_is_registered_with_the_codes_recipe() -> None:
    assert METHODS.get("fafi_code") is FAFICode and issubclass(FAFICode, FAFI)
    cfg = method_config(FAFICode, {})
    loss = cfg.loss
    assert (loss.ssl_denominator, loss.ssl_tau, loss.proto_tau) == ("all", 0.07, 1.0)
    assert (loss.proto_similarity, loss.proto_denominator, loss.proto_weight) == (
        "unit_feature",
        "all",
        2.0,
    )
    assert (loss.sep_weight, cfg.fusion, cfg.scoring) == (1.0, "data_size", "unit_feature")
    paper = method_config(FAFI, {})
    assert (paper.loss.proto_similarity, paper.fusion, paper.scoring) == (
        "cosine",
        "iffi",
        "cosine",
    )
    assert paper.crop_scale == cfg.crop_scale == (0.2, 1.0)
    # one loss option changed keeps the code's other loss defaults
    tau = method_config(FAFICode, {"loss": {"tau": 0.3}}).loss
    assert tau == dataclasses.replace(loss, tau=0.3)
    # the code's gradient clipping is fafi_code's local-training default, not fafi's
    run_cfg = load_config(None, [])
    assert run_cfg.train.grad_clip is None
    assert train_recipe(run_cfg, "fafi_code") == (
        dataclasses.replace(run_cfg.train, grad_clip=1.0),
        {"grad_clip": "fafi_code default"},
    )
    assert train_recipe(run_cfg, "fafi") == (run_cfg.train, {})


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"loss": {"proto_similarity": "unit_feature"}}, "needs proto_denominator='all'"),
        (
            {"loss": {"proto_similarity": "l1", "proto_denominator": "all"}},
            "proto_similarity must be",
        ),
        ({"scoring": "dot"}, "scoring must be one of"),
        ({"fusion": "max"}, "fusion must be one of"),
        ({"crop_scale": [0.5, 0.2]}, "crop_scale"),
        ({"crop_scale": [0.0, 1.0]}, "crop_scale"),
        ({"loss": {"ssl_tau": 0.0}}, "ssl_tau must be > 0"),
        ({"grad_clip": -1.0}, r"write method_train\.fafi\.grad_clip="),
    ],
)
def test_bad_new_options_are_refused(overrides: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        method_config(FAFI, overrides)


def test_crop_scale_reaches_the_pipeline() -> None:
    t = simclr_pipeline(16, (0.5,), (0.25,), crop_scale=(0.2, 1.0))
    assert isinstance(t, Compose)
    crops = [s for s in t.transforms if isinstance(s, RandomResizedCrop)]
    assert len(crops) == 1 and crops[0].scale == (0.2, 1.0)
    # larger minimum area -> larger boxes on average
    g = torch.Generator().manual_seed(0)
    small = RandomResizedCrop(16, scale=(0.08, 1.0)).boxes(2000, 16, 16, g, torch.device("cpu"))
    big = crops[0].boxes(2000, 16, 16, g, torch.device("cpu"))
    area = lambda b: (b[:, 2] * b[:, 3]).float().mean()  # noqa: E731
    assert float(area(big)) > float(area(small)) + 10
    assert t.key() != simclr_pipeline(16, (0.5,), (0.25,)).key()  # different cache entries


# --------------------------------------------------------------------------- end to end
def test_code_variant_on_digits_with_grad_clip_and_crop() -> None:
    cfg = load_config(
        None,
        [
            *TINY_FAFI_CODE,
            "train.epochs=15",
            "train.batch_size=32",
            "progress=false",
            "cache_dir=null",
        ],
    )
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    base = build_run(cfg, splits, fed, 0)
    run = method_run(cfg, "fafi_code", base)
    assert run.train.grad_clip == 1.0 and method_run(cfg, "fafi", base).train.grad_clip is None
    method = FAFICode(FAFICodeConfig(augment="flip"), run)
    res = run_simulation(method, run, splits.train, fed, threads_per_client=1)
    pred = method.predictor(res.state)
    assert isinstance(pred, IFFIPredictor) and pred.fusion == "data_size"
    assert pred.client_weights == [float(res.state["clients"][c]["num_samples"]) for c in range(3)]
    acc = evaluate(pred, splits.test, run.eval_transform, "cpu").accuracy
    assert acc > 0.5, acc  # chance is 0.1 (0.88 measured)
    # the prototypes of the code variant are raw: their norm is no longer the init's
    init = res.state["init"][method.arch_of(0)]["prototypes"]
    trained = res.state["clients"][0]["prototypes"]
    assert not torch.allclose(trained.norm(dim=1), init.norm(dim=1))
    other = dataclasses.replace(method.config, fusion="iffi", scoring="cosine")
    assert FAFICode(other, run).predictor(res.state).fusion == "iffi"


def test_held_prototype_update_keeps_the_absent_classes_anchors() -> None:
    cfg = load_config(
        None,
        [
            *TINY_FAFI_SKEWED,  # alpha 0.1: clients miss classes
            "train.epochs=2",
            "train.batch_size=16",
            "progress=false",
            "cache_dir=null",
        ],
    )
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    run = build_run(cfg, splits, fed, 0)
    opts = FAFIConfig(augment="flip", proto_init_std=0.125, proto_update="held")
    method = FAFI(opts, run)
    state = run_simulation(method, run, splits.train, fed, threads_per_client=1).state
    init = state["init"][method.arch_of(0)]["prototypes"]
    checked = 0
    for c, counts in enumerate(fed.class_counts):
        held = torch.tensor([int(n) > 0 for n in counts])
        cos = F.cosine_similarity(state["clients"][c]["prototypes"], init, dim=1)
        if (~held).any():
            # weight decay only rescales a row: its direction is the initial anchor
            torch.testing.assert_close(cos[~held], torch.ones(int((~held).sum())))
            checked += 1
        assert float(cos[held].min()) < 0.999  # the held classes' prototypes learn
    assert checked > 0
    with pytest.raises(ConfigError, match="proto_update"):
        FAFIConfig(proto_update="some")
