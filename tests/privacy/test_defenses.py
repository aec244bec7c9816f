"""Client-side defences: clipping bounds the update norm exactly, the Gaussian
noise has the requested std, sigma=0 and no clip is the identity, and the
wrapper leaves every other part of the method alone."""

from __future__ import annotations

import math

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.data.imageset import ImageSet
from osfl.data.transforms import build_transform
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, ModelSpec, RunContext
from osfl.fl.method import METHODS, AuditHistory, capability, rounds_of
from osfl.fl.train_config import TrainConfig
from osfl.privacy.defenses import DefendedMethod, DefenseConfig, apply_defense, clip_and_noise


def _norm(tensors: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors.values()))


def _update(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(20, 5, generator=g), "b": 3 * torch.randn(7, generator=g)}


def test_no_clip_no_noise_is_the_identity() -> None:
    up = _update()
    out, info = clip_and_noise(up, clip=None, sigma=0.0)
    for k in up:
        assert torch.equal(out[k], up[k])
    assert info["scale"] == 1.0


@pytest.mark.parametrize("clip", [0.5, 3.0, 1e-3])
def test_clipping_bounds_the_norm_exactly(clip: float) -> None:
    up = _update()
    assert _norm(up) > clip
    out, info = clip_and_noise(up, clip=clip, sigma=0.0)
    assert _norm(out) == pytest.approx(clip, rel=1e-6)
    assert info["norm"] == pytest.approx(_norm(up), rel=1e-9)
    for k in up:  # the direction is kept
        torch.testing.assert_close(out[k], up[k] * (clip / info["norm"]), rtol=1e-5, atol=1e-9)


def test_clipping_leaves_a_small_update_alone() -> None:
    up = _update()
    out, info = clip_and_noise(up, clip=10 * _norm(up), sigma=0.0)
    assert info["scale"] == 1.0
    for k in up:
        assert torch.equal(out[k], up[k])


def test_noise_has_the_requested_std_and_is_seeded() -> None:
    zeros = {"w": torch.zeros(100_000), "v": torch.zeros(300, 10)}
    sigma = 0.2
    out, _ = clip_and_noise(
        zeros, clip=None, sigma=sigma, generator=torch.Generator().manual_seed(3)
    )
    flat = torch.cat([t.flatten() for t in out.values()]).double()
    assert float(flat.std()) == pytest.approx(sigma, rel=0.02)
    assert abs(float(flat.mean())) < 5 * sigma / math.sqrt(flat.numel())
    again, _ = clip_and_noise(
        zeros, clip=None, sigma=sigma, generator=torch.Generator().manual_seed(3)
    )
    assert all(torch.equal(out[k], again[k]) for k in out)
    other, _ = clip_and_noise(
        zeros, clip=None, sigma=sigma, generator=torch.Generator().manual_seed(4)
    )
    assert not torch.equal(out["w"], other["w"])


def test_config_validation() -> None:
    for bad in (
        {"clip": 0.0},
        {"clip": -1.0},
        {"sigma": -0.1},
        {"sigma": float("nan")},
        {"scope": "x"},
    ):
        with pytest.raises(ConfigError):
            DefenseConfig(**bad)
    with pytest.raises(ConfigError, match="unknown defense option"):
        apply_defense(object(), {"clip": 1.0, "noise": 0.1})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the wrapper
@pytest.fixture(scope="module")
def setup() -> tuple[RunContext, ImageSet]:
    g = torch.Generator().manual_seed(0)
    data = ImageSet(
        images=torch.randint(0, 256, (24, 1, 8, 8), dtype=torch.uint8, generator=g),
        labels=torch.arange(24) % 4,
        classes=("a", "b", "c", "d"),
    )
    tf = build_transform("none", image_size=8, mean=(0.5,), std=(0.5,))
    run = RunContext(
        num_classes=4,
        image_shape=(1, 8, 8),
        num_clients=2,
        model=ModelSpec("cnn_small", {"in_chans": 1, "img_size": 8}),
        train=TrainConfig(epochs=1, batch_size=8, lr=0.1, optimizer="sgd"),
        train_transform=tf,
        eval_transform=tf,
    )
    return run, data


def _client(run: RunContext, method, data: ImageSet):
    state = method.init_state()
    b = method.broadcast(state, 0)
    ctx = ClientContext(run, 0, 0, torch.Generator().manual_seed(0))
    return state, b, method.client_update(ctx, b, data)


def _fedavg(run: RunContext, name: str = "fedavg"):
    cls = METHODS.get(name)
    return cls(cls.Config(rounds=2), run)


def test_inactive_defense_returns_the_method_itself(setup) -> None:
    run, _ = setup
    m = _fedavg(run)
    assert apply_defense(m, {}) is m
    assert apply_defense(m, {"sigma": 0.0, "clip": None}) is m
    assert apply_defense(m, None) is m


def test_wrapper_clips_the_parameter_update_only(setup) -> None:
    run, data = setup
    clip = 1e-3
    wrapped = apply_defense(_fedavg(run), {"clip": clip})
    assert isinstance(wrapped, DefendedMethod)
    _, b, up = _client(run, wrapped, data)
    _, _, clean = _client(run, _fedavg(run), data)
    names = [n for n, _ in run.model.build(4).named_parameters()]
    delta = {k: up.tensors[k] - b.tensors[k] for k in names}
    clean_delta = {k: clean.tensors[k] - b.tensors[k] for k in names}
    assert _norm(clean_delta) > clip
    assert _norm(delta) == pytest.approx(clip, rel=1e-4)
    for k, v in up.tensors.items():  # buffers (BatchNorm statistics) untouched
        if k not in names:
            assert torch.equal(v, clean.tensors[k])
    assert up.meta == clean.meta


def test_wrapper_noise_is_seeded_per_client_and_round(setup) -> None:
    run, data = setup
    m1 = apply_defense(_fedavg(run), {"sigma": 0.05})
    m2 = apply_defense(_fedavg(run), {"sigma": 0.05})
    _, _, up1 = _client(run, m1, data)
    _, _, up2 = _client(run, m2, data)
    _, _, clean = _client(run, _fedavg(run), data)
    for k in up1.tensors:
        assert torch.equal(up1.tensors[k], up2.tensors[k])
    k = "fc.weight"
    noise = (up1.tensors[k] - clean.tensors[k]).double()
    assert 0.03 < float(noise.std()) < 0.07


def test_wrapper_delegates_everything_else(setup) -> None:
    run, data = setup
    inner = METHODS.get("scaffold")(METHODS.get("scaffold").Config(rounds=3), run)
    m = apply_defense(inner, {"clip": 1.0, "sigma": 0.01})
    assert m.name == "scaffold" and rounds_of(m) == 3 and m.card.one_shot is False
    state, _, up = _client(run, m, data)
    for c in (0, 1):  # the declared hook reaches the inner scheme's history
        audited = capability(m, AuditHistory)
        assert audited is inner  # found through the wrapper
        hist, inner_hist = audited.audit_history(state, c), inner.audit_history(state, c)
        assert hist.keys() == inner_hist.keys() and hist
        assert all(torch.equal(hist[k], inner_hist[k]) for k in hist)
    spec = m.upload_spec(state, 0, 0)
    from osfl.fl.upload import validate

    validate(up, spec)
    assert m.public_hparams()["defense"] == {"clip": 1.0, "sigma": 0.01, "scope": "parameters"}
    assert m.public_hparams()["fl"]["scheme"] == "scaffold"
    new = m.aggregate(state, {0: up}, 0)
    assert set(new.model) == set(state.model)
