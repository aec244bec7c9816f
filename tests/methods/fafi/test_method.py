"""The ``fafi`` method: config checks, uploads (extractor + prototypes only), the
client cache, mixed architectures, ablation switches, and an end-to-end digits run."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.data.imageset import ImageSet
from osfl.data.transforms import Compose, Normalize, ToFloat, build_transform
from osfl.errors import ConfigError, UploadError
from osfl.fl.evaluate import evaluate
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.upload import Upload, validate
from osfl.methods.fafi import (
    FAFI,
    FAFIConfig,
    FAFINet,
    IFFIPredictor,
    NoiseSpec,
    SaltLoss,
    TwoViews,
)
from osfl.methods.fafi.inference import masked_mean_prototypes
from osfl.methods.fafi.local import class_mean_prototypes, find_normalize
from osfl.methods.fedavg import FedAvg, FedAvgConfig
from osfl.models import create_model
from support.tiny import TINY


@pytest.fixture(scope="module")
def tiny_data() -> tuple[Any, Any]:
    cfg = load_config(None, [*TINY, "cache_dir=null"])
    return cfg, load_splits(cfg)


@pytest.fixture
def make_ctx(tiny_data, tmp_path):
    cfg, splits = tiny_data

    def make(num_clients: int = 3, cache: bool = True) -> SeedContext:
        c = dataclasses.replace(
            cfg,
            partition=dataclasses.replace(cfg.partition, num_clients=num_clients),
            cache_dir=str(tmp_path / "cache") if cache else None,
        )
        fed = build_federation(c, splits.train, 0)
        return SeedContext(splits, fed, build_run(c, splits, fed, 0))

    return make


def simulate(method: Any, ctx: SeedContext) -> Any:
    return run_simulation(method, ctx.run, ctx.splits.train, ctx.federation, threads_per_client=1)


# --------------------------------------------------------------------------- config
def test_registered_with_paper_defaults() -> None:
    assert METHODS.get("fafi") is FAFI
    cfg = method_config(FAFI, {})
    assert (cfg.loss.tau, cfg.noise.mean, cfg.noise.std) == (0.5, 0.0, 1.0)  # Appendix E
    loss = cfg.loss
    assert (loss.ssl_weight, loss.proto_weight, loss.ce_weight, loss.sep_weight) == (1, 1, 0, 0)
    assert cfg.fusion == "iffi" and cfg.prototype_kind == "learned" and not loss.plain_ce


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"loss": {"tau": 0}}, "method.fafi: loss: tau must be > 0"),
        ({"fusion": "max"}, "fusion must be one of"),
        ({"loss": {"ssl_weight": 0, "proto_weight": 0}}, "at least one of"),
        (
            {"loss": {"proto_weight": 0}, "prototypes": "learned"},
            r"needs loss\.proto_weight > 0",
        ),
        ({"prototypes": "head"}, r"needs loss\.ce_weight > 0"),
        ({"loss": {"ssl_denominator": "some"}}, "ssl_denominator must be one of"),
        ({"augment": "nope"}, "unknown transform pipeline"),
        ({"noise": {"std": -1.0}}, r"noise\.std"),
        ({"noise": {"samples": 0}}, r"noise\.samples"),
        ({"feature_dim": 0}, "feature_dim"),
        ({"bogus": 1}, "unknown option"),
        ({"loss": {"bogus": 1}}, r"unknown option 'bogus' in method\.fafi\.loss"),
    ],
)
def test_bad_options_are_refused(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        method_config(FAFI, overrides)


def test_prototype_kind_resolution() -> None:
    assert FAFIConfig(loss=SaltLoss(proto_weight=0)).prototype_kind == "class_mean"
    plain = FAFIConfig(loss=SaltLoss(proto_weight=0, ssl_weight=0, ce_weight=1))
    assert plain.prototype_kind == "head" and plain.loss.plain_ce


@pytest.mark.parametrize(
    ("flat", "nested"),
    [
        ("tau", "loss.tau"),
        ("ssl_weight", "loss.ssl_weight"),
        ("proto_similarity", "loss.proto_similarity"),
        ("noise_std", "noise.std"),
        ("noise_samples", "noise.samples"),
    ],
)
def test_a_flat_key_of_a_nested_option_names_the_dotted_key(flat: str, nested: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"'{flat}' for method 'fafi': write method\.fafi\.{nested}="
    ):
        method_config(FAFI, {flat: 1})


# --------------------------------------------------------------------------- client parts
def test_two_views_are_per_sample_and_seeded() -> None:
    base = build_transform("simclr", image_size=8, mean=(0.5,), std=(0.25,))
    tv = TwoViews(base)
    x = torch.randint(0, 256, (4, 1, 8, 8), dtype=torch.uint8)
    a = tv(x, torch.Generator().manual_seed(3))
    b = tv(x, torch.Generator().manual_seed(3))
    assert a.shape == (8, 1, 8, 8) and torch.equal(a, b)
    assert not torch.equal(a[:4], a[4:])  # two different draws
    assert "two_views" in tv.key()


def test_salt_loss_needs_two_views_and_trains() -> None:
    torch.manual_seed(0)
    net = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3)
    loss = SaltLoss(ce_weight=0.5, sep_weight=0.5)
    y = torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match="two views"):
        loss(net, torch.randn(4, 1, 8, 8), y)
    x = torch.randn(8, 1, 8, 8)
    value = loss(net, x, y)
    value.backward()
    assert torch.isfinite(value)
    assert net.prototypes.grad is not None and net.prototypes.grad.abs().sum() > 0


def test_projection_and_head() -> None:
    backbone = create_model("cnn_small", num_classes=3, in_chans=1, width=4)
    plain = FAFINet(backbone, 3)
    assert plain.feature_dim == backbone.num_features and plain.head is None
    assert plain.head_weight() is backbone.get_classifier().weight
    proj = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3, 7)
    x = torch.randn(2, 1, 8, 8)
    assert proj.features(x).shape == (2, 7) and proj.logits(proj.features(x)).shape == (2, 3)
    assert proj.extractor()(x).shape == (2, 7)
    assert not any(k.startswith("head") for k in proj.extractor().state_dict())


def test_find_normalize() -> None:
    n = Normalize((0.1,), (0.2,))
    assert find_normalize(Compose([ToFloat(), Compose([n])])) is n
    assert find_normalize(ToFloat()) is None


def test_class_mean_prototypes_by_hand() -> None:
    class Ident(torch.nn.Module):
        num_features = 2

        def forward_features(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)

    net = FAFINet(Ident(), 3)
    imgs = torch.tensor([[[[3, 0]]], [[[0, 5]]], [[[1, 1]]]], dtype=torch.uint8)
    data = ImageSet(imgs, torch.tensor([0, 0, 2]), classes=("a", "b", "c"))
    protos = class_mean_prototypes(net, data, ToFloat(), torch.device("cpu"))
    # class 0: mean of unit (1,0) and (0,1); class 1 absent -> zero; class 2: (1,1)/sqrt2
    r = 2**-0.5
    assert torch.allclose(protos, torch.tensor([[0.5, 0.5], [0.0, 0.0], [r, r]]), atol=1e-6)
    other = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    mean = masked_mean_prototypes([protos, other])
    assert torch.allclose(mean, torch.tensor([[0.75, 0.25], [0.0, 2.0], [r, r]]), atol=1e-6)


# --------------------------------------------------------------------------- protocol
def test_upload_is_extractor_and_prototypes_only(make_ctx) -> None:
    ctx = make_ctx(3)
    method = FAFI(FAFIConfig(), ctx.run)
    res = simulate(method, ctx)
    assert res.refused == [] and sorted(res.state["clients"]) == [0, 1, 2]
    entry = res.state["clients"][0]
    assert entry["prototypes"].shape == (10, 32)  # C × D (cnn_small width 8 -> 32-d)
    # a client's upload: exactly the extractor keys + prototypes
    state = method.init_state()
    spec = method.upload_spec(state, 0, 0)
    assert set(spec.tensors) == {"prototypes"} | {"extractor." + k for k in entry["extractor"]}
    assert not any("fc." in k for k in spec.tensors)  # no classifier head
    good = Upload(
        tensors={"prototypes": entry["prototypes"]}
        | {"extractor." + k: v for k, v in entry["extractor"].items()},
        meta={"num_samples": 5},
    )
    validate(good, spec, client=0)
    with pytest.raises(UploadError, match="unexpected"):
        validate(Upload({**good.tensors, "fc.weight": torch.zeros(10, 32)}, good.meta), spec)
    bad = dict(good.tensors)
    bad["prototypes"] = torch.zeros(10, 31)
    with pytest.raises(UploadError, match="prototypes"):
        validate(Upload(bad, good.meta), spec, client=1)
    bad["prototypes"] = torch.full((10, 32), float("nan"))
    with pytest.raises(UploadError, match="NaN"):
        validate(Upload(bad, good.meta), spec, client=1)
    acc = evaluate(res.predictor, ctx.splits.test, ctx.run.eval_transform, "cpu").accuracy
    assert 0.0 <= acc <= 1.0
    assert res.bytes_up > 0


def test_cache_objective_key_and_plain_ce_sharing(make_ctx) -> None:
    ctx = make_ctx(3)
    cache = ctx.run.cache
    simulate(FedAvg(FedAvgConfig(), ctx.run), ctx)
    assert len(cache) == 3
    # FAFI's SALT clients are new entries (objective "fafi"), then found again
    simulate(FAFI(FAFIConfig(), ctx.run), ctx)
    assert len(cache) == 6
    hits = cache.hits
    simulate(FAFI(FAFIConfig(fusion="average"), ctx.run), ctx)
    assert len(cache) == 6 and cache.hits == hits + 3
    # SALT off = the plain CE client = FedAvg's cache entry
    hits = cache.hits
    plain = FAFIConfig(loss=SaltLoss(ssl_weight=0, proto_weight=0, ce_weight=1))
    res = simulate(FAFI(plain, ctx.run), ctx)
    assert len(cache) == 6 and cache.hits == hits + 3
    # its prototypes are the classifier rows of the FedAvg client
    assert res.state["clients"][0]["prototypes"].shape == (10, 32)


def test_fusion_variants_share_clients(make_ctx) -> None:
    ctx = make_ctx(3, cache=False)
    method = FAFI(FAFIConfig(), ctx.run)
    state = simulate(method, ctx).state
    x = ctx.run.eval_transform(ctx.splits.test.images[:6])
    for fusion, members in (("iffi", 3), ("average", 3), ("params", 1)):
        pred = FAFI(FAFIConfig(fusion=fusion), ctx.run).predictor(state).eval()
        assert isinstance(pred, IFFIPredictor) and len(pred.extractors) == members
        with torch.no_grad():
            out = pred(x)
        assert out.shape == (6, 10) and bool(torch.isfinite(out).all())
    iffi = FAFI(FAFIConfig(noise=NoiseSpec(samples=2)), ctx.run).predictor(state).eval()
    with torch.no_grad():
        iffi(x)
    assert iffi.noise.shape == (2, *x.shape[1:])  # drawn at the evaluation shape
    assert iffi.last_weights.shape == (3, 6)


def test_mixed_architectures_fuse_through_a_projection(make_ctx) -> None:
    ctx = make_ctx(3, cache=False)
    cfg = FAFIConfig(
        feature_dim=12, models=["cnn_small", "resnet18"], model_kwargs={"resnet18": {"width": 4}}
    )
    method = FAFI(cfg, ctx.run)
    assert [method.arch_of(c) for c in range(3)] == ["cnn_small", "resnet18", "cnn_small"]
    res = simulate(method, ctx)
    assert res.refused == [] and sorted(res.state["clients"]) == [0, 1, 2]
    x = ctx.run.eval_transform(ctx.splits.test.images[:4])
    with torch.no_grad():
        assert res.predictor.eval()(x).shape == (4, 10)
    # each client's upload is checked against its own architecture, before aggregate()
    state = res.state
    swapped = Upload(
        tensors={"prototypes": state["clients"][0]["prototypes"]}
        | {"extractor." + k: v for k, v in state["clients"][0]["extractor"].items()},
        meta={"num_samples": 4},
    )
    validate(swapped, method.upload_spec(state, 0, 0), client=0)  # client 0's own architecture
    with pytest.raises(UploadError, match=r"client 1.*missing tensor.*and \d+ more"):
        validate(swapped, method.upload_spec(state, 0, 1), client=1)  # resnet18's client
    with pytest.raises(ConfigError, match="one architecture"):
        FAFI(dataclasses.replace(cfg, fusion="params"), ctx.run).predictor(state)


def test_salt_transform_views_at_the_eval_size_with_the_runs_statistics(make_ctx) -> None:
    """Both views come from the ``augment`` pipeline, sized and normalised as
    the run's evaluation transform: with ``augment=none`` each view equals
    the evaluation input exactly; ``simclr`` keeps FAFI's crop scale."""
    from osfl.data.transforms import simclr_pipeline
    from osfl.fl.cache import transform_key
    from osfl.methods.fafi.architectures import Architectures
    from osfl.methods.fafi.local import salt_transform

    ctx = make_ctx(2)
    data = ctx.splits.train
    x = data.images[:3]
    plain = salt_transform(Architectures(ctx.run, FAFIConfig(augment="none")), data)
    views = plain(x, torch.Generator().manual_seed(0))
    expect = ctx.run.eval_transform(x)
    assert views.shape == (6, *expect.shape[1:])
    assert torch.equal(views[:3], expect) and torch.equal(views[3:], expect)
    norm = find_normalize(ctx.run.eval_transform)
    assert norm is not None and norm.mean != (0.0,)  # the run's own statistics, not (0, 1)
    simclr = salt_transform(Architectures(ctx.run, FAFIConfig(crop_scale=(0.3, 0.9))), data)
    h = expect.shape[-1]
    assert simclr.key() == {"two_views": transform_key(
        simclr_pipeline(h, norm.mean, norm.std, crop_scale=(0.3, 0.9)))}  # fmt: skip
    flip = salt_transform(Architectures(ctx.run, FAFIConfig(augment="flip")), data)
    assert flip.key() == {"two_views": transform_key(
        build_transform("flip", image_size=h, mean=norm.mean, std=norm.std))}  # fmt: skip


def test_plain_ce_loss_goes_through_the_projection_and_head() -> None:
    from osfl.methods.fafi.local import _ce_loss

    torch.manual_seed(0)
    net = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3, 5)
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 1])
    expect = torch.nn.functional.cross_entropy(net.logits(net.features(x)), y)
    assert torch.allclose(_ce_loss(net, x, y), expect, rtol=0, atol=1e-7)
    assert _ce_loss(net, x.half().float(), y).dtype == torch.float32


def test_salt_transform_without_a_normalize_leaves_the_scale_alone(make_ctx) -> None:
    """A run whose evaluation transform does not normalise: the views are the
    raw [0, 1] images (mean 0, std 1 on every channel), no normalisation."""
    from osfl.data.transforms import ToFloat
    from osfl.methods.fafi.architectures import Architectures
    from osfl.methods.fafi.local import salt_transform

    ctx = make_ctx(2)
    run = dataclasses.replace(ctx.run, eval_transform=ToFloat())
    data = ctx.splits.train
    views = salt_transform(Architectures(run, FAFIConfig(augment="none")), data)(data.images[:2])
    expect = data.images[:2].float() / 255
    assert torch.allclose(views, torch.cat([expect, expect]), rtol=0, atol=1e-6)


def test_class_mean_prototypes_stay_on_the_device() -> None:
    """The prototype sums and counts live where the model does: a CPU buffer
    meeting the device's features raises (tests/support/simulated_device.py)."""
    from support.simulated_device import simulated_device

    torch.manual_seed(0)
    data = ImageSet(torch.randint(0, 256, (12, 1, 8, 8), dtype=torch.uint8),
                    torch.arange(12) % 3, classes=("a", "b", "c"))  # fmt: skip
    tf = build_transform("none", image_size=8, mean=(0.5,), std=(0.25,))
    net = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3).eval()
    cpu = class_mean_prototypes(net, data, tf, torch.device("cpu"), batch=5)
    with simulated_device() as dev:
        on = class_mean_prototypes(net.to(dev), data, tf, dev, batch=5)  # raises on a mix
    assert on.device.type == "cpu"  # handed back on the CPU for the upload
    assert torch.allclose(on.cpu(), cpu, rtol=0, atol=1e-6)


def test_a_fafinet_alone_scores_cosines_to_its_prototypes_and_its_head_is_the_projections() -> None:
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = FAFINet(create_model("cnn_small", num_classes=3, in_chans=1, width=4), 3, 5)
    x = torch.randn(4, 1, 8, 8)
    f, p = F.normalize(net.features(x), dim=1), F.normalize(net.prototypes, dim=1)
    assert torch.allclose(net(x), f @ p.T, rtol=0, atol=1e-5)
    # with a projection the CE head is the FAFINet's own, not the backbone's classifier
    assert net.head is not None and net.head_weight() is net.head.weight
    assert net.head_weight().shape == (3, 5)
