"""The frozen-encoder machinery shared by FALCON, FedPFT and FedCGS: HSE views,
the encoder and its identity, the token cache (a second method does not
encode again), the broadcast check, the predictor's views and the tensor
training loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.fl.cache import state_hash
from osfl.fl.context import ClientContext
from osfl.fl.upload import Broadcast
from osfl.methods.falcon import FALCON
from osfl.methods.fedcgs import FedCGS
from osfl.methods.fedpft import FedPFT
from osfl.methods.frozen import (
    FitConfig,
    FrozenEncoder,
    HSEConfig,
    ViewSet,
    build_frozen_encoder,
    fit,
    global_view,
    region_views,
)
from osfl.methods.frozen.encoder import EncoderConfig
from support.tiny import TINY_FROZEN

FALCON_FAST = {
    "views": {"input_size": 16, "window": 8, "stride": 8},
    "generator_model": {"depth": 1, "heads": 2, "components": 2},
    "generator_fit": {"epochs": 2, "batch_size": 64},
    "classifier_fit": {"epochs": 2, "batch_size": 64},
    "server_fit": {"epochs": 2, "batch_size": 64},
}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    cfg = load_config(None, [*TINY_FROZEN, "cache_dir=null"])
    return cfg, load_splits(cfg)


@pytest.fixture
def make_ctx(tiny, tmp_path):
    cfg, splits = tiny

    def make(cache: bool = True, **model_kwargs: Any) -> SeedContext:
        model = dataclasses.replace(cfg.model, kwargs={**cfg.model.kwargs, **model_kwargs})
        c = dataclasses.replace(
            cfg, model=model, cache_dir=str(tmp_path / "cache") if cache else None
        )
        fed = build_federation(c, splits.train, 0)
        return SeedContext(splits, fed, build_run(c, splits, fed, 0))

    return make


def client_ctx(ctx: SeedContext, client: int = 0) -> tuple[ClientContext, Any]:
    data = ctx.splits.train.subset(ctx.federation.client_indices[client].copy())
    return ClientContext(ctx.run, client, 0, torch.Generator().manual_seed(client)), data


# --------------------------------------------------------------------------- views
def test_region_views_are_the_windows_at_native_resolution() -> None:
    x = torch.arange(2 * 1 * 16 * 16, dtype=torch.float32).reshape(2, 1, 16, 16)
    v = region_views(x, size=8, input_size=16, window=8, stride=8)
    assert v.shape == (2, 4, 1, 8, 8)
    # row-major: top-left, top-right, bottom-left, bottom-right, no resampling
    assert torch.equal(v[:, 0], x[..., :8, :8])
    assert torch.equal(v[:, 1], x[..., :8, 8:])
    assert torch.equal(v[:, 2], x[..., 8:, :8])
    assert torch.equal(v[:, 3], x[..., 8:, 8:])
    overlapping = region_views(x, size=8, input_size=16, window=8, stride=4)
    assert overlapping.shape == (2, 9, 1, 8, 8)
    assert torch.equal(overlapping[:, 1], x[..., :8, 4:12])


def test_region_views_resize_input_and_windows() -> None:
    x = torch.rand(3, 3, 12, 12)
    v = region_views(x, size=8, input_size=32, window=16, stride=16)  # 448/224/224 shape
    assert v.shape == (3, 4, 3, 8, 8)
    g = global_view(x, 8)
    assert g.shape == (3, 1, 3, 8, 8)
    # a constant image stays constant through every resize (no renormalisation)
    c = torch.full((1, 3, 12, 12), -0.7)
    assert torch.allclose(region_views(c, 8, 32, 16, 16), torch.tensor(-0.7))
    assert torch.allclose(global_view(c, 8), torch.tensor(-0.7))


def test_view_set_resolution_and_bad_windows() -> None:
    vs = ViewSet.regions(HSEConfig(), size=8, image_size=16)
    assert (vs.input_size, vs.window, vs.stride, vs.num_views) == (16, 8, 8, 4)
    assert ViewSet("global", 8).num_views == 1
    with pytest.raises(ConfigError, match=r"larger than views\.input_size"):
        ViewSet.regions(HSEConfig(input_size=8, window=16), size=8, image_size=16)
    with pytest.raises(ConfigError, match="positive integer"):
        HSEConfig(stride=0)


# --------------------------------------------------------------------------- encoder
def test_encoder_is_frozen_and_reports_random_weights(make_ctx) -> None:
    ctx = make_ctx(cache=False)
    enc = build_frozen_encoder(ctx.run, EncoderConfig())
    enc.train()
    assert not enc.training and not enc.model.training
    assert not any(p.requires_grad for p in enc.parameters())
    d = enc.describe()
    assert d["weights"] == "random" and d["pretrained"] is None
    assert d["dim"] == 16 and d["size"] == 8
    assert d["hash"] == state_hash(enc.model.state_dict())
    # same run seed -> same random weights on every party
    assert build_frozen_encoder(ctx.run, EncoderConfig()).hash == enc.hash


def test_encoder_loads_a_pretrained_file_and_says_so(make_ctx, tmp_path) -> None:
    ctx = make_ctx(cache=False)
    donor = build_frozen_encoder(ctx.run, EncoderConfig()).model
    with torch.no_grad():
        for p in donor.parameters():
            p.add_(0.5)
    path = tmp_path / "enc.safetensors"
    save_file({k: v.contiguous() for k, v in donor.state_dict().items()}, str(path))
    ctx2 = make_ctx(cache=False, pretrained=str(path))
    enc = build_frozen_encoder(ctx2.run, EncoderConfig())
    d = enc.describe()
    assert d["weights"] == "pretrained" and d["pretrained"] == str(path)
    assert d["hash"] == state_hash(donor.state_dict())
    # shapes are read without touching the checkpoint
    assert FedCGS(method_config(FedCGS), ctx2.run).token_dim() == 16


def test_broadcast_is_only_the_encoder_identity_and_clients_check_it(make_ctx) -> None:
    ctx = make_ctx(cache=False)
    m = FedCGS(method_config(FedCGS), ctx.run)
    state = m.init_state()
    b = m.broadcast(state, 0)
    assert b.tensors == {}
    assert b.meta["encoder_hash"] == m.encoder().hash
    assert b.nbytes < 300  # honest: nothing but the identity goes down
    cctx, data = client_ctx(ctx, 1)
    bad = Broadcast(tensors={}, meta={**b.meta, "encoder_hash": "0" * 32})
    with pytest.raises(ConfigError, match="client 1: the server announced encoder weights"):
        m.client_update(cctx, bad, data)


# --------------------------------------------------------------------------- token cache
class _CountForwards:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls = 0
        original = FrozenEncoder.forward

        def counted(enc: FrozenEncoder, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return original(enc, x)

        monkeypatch.setattr(FrozenEncoder, "forward", counted)


def test_a_second_method_skips_encoding(make_ctx, monkeypatch) -> None:
    ctx = make_ctx(cache=True)
    count = _CountForwards(monkeypatch)
    cctx, data = client_ctx(ctx, 0)
    cgs = FedCGS(method_config(FedCGS), ctx.run)
    b = cgs.broadcast(cgs.init_state(), 0)
    cgs.client_update(cctx, b, data)
    first = count.calls
    assert first > 0

    pft = FedPFT(method_config(FedPFT, {"components": 2, "max_iter": 10}), ctx.run)
    pft.client_update(cctx, pft.broadcast(pft.init_state(), 0), data)
    assert count.calls == first  # FedPFT read FedCGS's global tokens

    fal = FALCON(method_config(FALCON, FALCON_FAST), ctx.run)
    fb = fal.broadcast(fal.init_state(), 0)
    fal.client_update(cctx, fb, data)
    regions_only = count.calls - first
    assert regions_only == 1  # one batch of region views; s0 came from the cache
    fal.client_update(cctx, fb, data)
    assert count.calls == first + regions_only  # everything cached now
    assert ctx.run.cache is not None and ctx.run.cache.hits >= 3


def test_cached_tokens_equal_what_the_predictor_computes(make_ctx) -> None:
    """Clients and the global model see the same views of the same transformed
    pixels (normalised once, by the run)."""
    ctx = make_ctx(cache=True)
    cctx, data = client_ctx(ctx, 2)
    m = FALCON(method_config(FALCON, FALCON_FAST), ctx.run)
    tokens = m.client_tokens(cctx, data, m.encoder())
    again = m.client_tokens(cctx, data, m.encoder())  # from the cache
    assert torch.equal(tokens, again)
    from osfl.methods.frozen import TokenPredictor

    pred = TokenPredictor(m.encoder(), m.view_sets(), torch.nn.Identity())
    direct = pred.tokens(ctx.run.eval_transform(data.images))
    assert tokens.shape == (len(data), 5, 16)
    assert torch.allclose(tokens, direct, atol=1e-6)


# --------------------------------------------------------------------------- fit
def test_fit_is_seeded_and_lowers_the_loss() -> None:
    torch.manual_seed(0)
    x = torch.randn(200, 4)
    y = (x[:, 0] > 0).long()

    def run() -> tuple[list[float], torch.Tensor]:
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
        losses = fit(
            m,
            [x, y],
            lambda mod, a, b: torch.nn.functional.cross_entropy(mod(a), b),
            FitConfig(epochs=15, batch_size=32, lr=0.02),
            generator=torch.Generator().manual_seed(3),
        )
        return losses, m[0].weight.detach().clone()

    l1, w1 = run()
    l2, w2 = run()
    assert l1 == l2 and torch.equal(w1, w2)  # dropout draws are seeded too
    assert l1[-1] < 0.5 * l1[0]
    with pytest.raises(ConfigError, match="nothing to train on"):
        fit(
            torch.nn.Linear(1, 1),
            [torch.zeros(0, 1)],
            lambda *a: None,
            FitConfig(),
            generator=torch.Generator(),
        )
    with pytest.raises(ConfigError, match="optimizer"):
        FitConfig(optimizer="nope")
    with pytest.raises(ConfigError, match="keep must be one of last, lowest_loss"):
        FitConfig(keep="best")


def _weights_after_each_epoch(
    cfg: FitConfig, loss_of_epoch: list[float], score: Any = None
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A one-parameter model whose epoch e ends at weight e + 1 with mean loss
    ``loss_of_epoch[e]`` (one batch per epoch, SGD at lr 1 on a linear loss)."""
    m = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.zero_()
    seen: list[torch.Tensor] = []
    epoch = iter(range(len(loss_of_epoch)))

    def loss(mod: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        e = next(epoch)
        target = torch.tensor(loss_of_epoch[e])
        # gradient -1 on the weight: SGD at lr 1 adds one per epoch
        return -mod.weight.sum() + (target + mod.weight.sum()).detach()

    def scoring(mod: torch.nn.Module) -> float:
        seen.append(mod.weight.detach().clone())
        return score(mod) if score else 0.0

    fit(
        m,
        [torch.zeros(1, 1)],
        loss,
        dataclasses.replace(cfg, epochs=len(loss_of_epoch), batch_size=1, optimizer="sgd", lr=1.0),
        generator=torch.Generator().manual_seed(0),
        score=scoring if score else None,
    )
    return seen, m.weight.detach().clone()


def test_fit_keeps_the_epoch_it_is_told_to() -> None:
    """``last``: the final weights; ``lowest_loss``: those after the epoch
    of the lowest mean loss (the first of equals; a NaN epoch never wins);
    a ``score``: those after the best-scoring epoch, scored in eval mode."""
    losses = [3.0, 1.0, 2.0, 1.0, float("nan")]
    _, last = _weights_after_each_epoch(FitConfig(), losses)
    assert last.item() == 5.0
    _, lowest = _weights_after_each_epoch(FitConfig(keep="lowest_loss"), losses)
    assert lowest.item() == 2.0  # epoch 2 (weight 2): the first loss of 1.0
    _, nan_first = _weights_after_each_epoch(
        FitConfig(keep="lowest_loss"), [float("nan"), 4.0, 5.0]
    )
    assert nan_first.item() == 2.0
    modes: list[bool] = []

    def score(mod: torch.nn.Module) -> float:
        modes.append(mod.training)
        return -abs(mod.weight.item() - 3.0)  # best after epoch 3

    seen, chosen = _weights_after_each_epoch(FitConfig(keep="lowest_loss"), losses, score)
    assert [w.item() for w in seen] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert chosen.item() == 3.0  # the score overrides keep
    assert modes == [False] * 5
