"""The token-inversion attack (FALCON Table 5 shape): it rebuilds the public
encoder from an Observation, reads the synthetic sequences of either upload
form (and FedPFT's mixtures), trains a decoder on auxiliary images and scores
real vs synthetic reconstructions; bad inputs are refused clearly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.observation import Observation, observe
from osfl.methods.falcon import FALCON
from osfl.methods.fedpft import FedPFT
from osfl.privacy import RECONSTRUCTION_ATTACKS, ObservationError, run_reconstruction_attack
from osfl.privacy.audit.recorder import observation_hparams
from osfl.privacy.token_inversion import (
    SYNTHETIC_SOURCES,
    TokenDecoder,
    best_match_scores,
    token_encoder_from_observation,
)

TINY = [
    "data.image_size=16",
    "data.max_per_class=12",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.num_clients=2",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
    "progress=false",
    "cache_dir=null",
]
FAST = {
    "views": {"input_size": 16, "window": 8, "stride": 8},
    "generator_model": {"depth": 1, "heads": 2, "components": 2},
    "generator_fit": {"epochs": 3, "batch_size": 64},
    "classifier_fit": {"epochs": 2, "batch_size": 64},
    "server_fit": {"epochs": 2, "batch_size": 64},
}
ATTACK = {"epochs": 25, "batch_size": 64, "lr": 5e-3, "width": 16, "max_targets": 12}


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    cfg = load_config(None, TINY)
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    ctx = SeedContext(splits, fed, build_run(cfg, splits, fed, 0))
    return {"ctx": ctx}


def observed(ctx: SeedContext, method: Any, client: int = 0) -> tuple[Observation, Any]:
    data = ctx.splits.train.subset(ctx.federation.client_indices[client].copy())
    b = method.broadcast(method.init_state(), 0)
    up = method.client_update(ClientContext(ctx.run, client, 0, torch.Generator()), b, data)
    obs = observe(
        client,
        0,
        broadcast=b.tensors,
        upload=up.tensors,
        upload_meta=up.meta,
        hparams=observation_hparams(method, ctx.run),
    )
    return obs, data


def test_registry_and_decoder_shapes() -> None:
    assert "token_inversion" in RECONSTRUCTION_ATTACKS.names()
    assert {"falcon", "fedpft"} <= set(SYNTHETIC_SOURCES.names())
    for shape in [(1, 16, 16), (3, 32, 32), (3, 448, 448)]:
        dec = TokenDecoder(5, 8, shape, width=16)
        assert dec(torch.randn(2, 5, 8)).shape == (2, *shape)


def test_encoder_rebuilt_from_the_observation_matches_the_clients(setup) -> None:
    ctx = setup["ctx"]
    m = FALCON(method_config(FALCON, {**FAST, "upload": "sequences"}), ctx.run)
    obs, data = observed(ctx, m)
    with pytest.raises(ObservationError, match="run_seed"):
        token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform)
    enc = token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    assert enc.encoder.hash == m.encoder().hash
    assert (enc.num_views, enc.dim) == (5, 16)
    cctx = ClientContext(ctx.run, 0, 0, torch.Generator())
    assert torch.allclose(enc(data.images), m.client_tokens(cctx, data, m.encoder()), atol=1e-6)


@pytest.mark.parametrize("form", ["sequences", "generator"])
def test_synthetic_sequences_of_either_form(setup, form: str) -> None:
    ctx = setup["ctx"]
    m = FALCON(method_config(FALCON, {**FAST, "upload": form}), ctx.run)
    obs, data = observed(ctx, m)
    enc = token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    syn = SYNTHETIC_SOURCES.get("falcon")(obs, enc, torch.Generator().manual_seed(0))
    assert syn.shape == (sum(obs.upload_meta["synthetic_counts"]), 5, 16)
    assert bool(torch.isfinite(syn).all())


def test_attack_scores_real_and_synthetic_reconstructions(setup) -> None:
    ctx = setup["ctx"]
    m = FALCON(method_config(FALCON, {**FAST, "upload": "sequences"}), ctx.run)
    obs, data = observed(ctx, m)
    aux = ctx.splits.test.subset(list(range(0, len(ctx.splits.test), 2)))
    enc = token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    res = run_reconstruction_attack("token_inversion", obs, aux, encode=enc, private=data, **ATTACK)
    assert res.num_targets == 12 and res.num_synthetic == sum(obs.upload_meta["synthetic_counts"])
    for k in ("real", "synthetic"):
        img = res.images[k]
        assert img.shape[1:] == (1, 16, 16) and float(img.min()) >= 0 and float(img.max()) <= 1
    assert res.psnr_synthetic is not None and res.ssim_synthetic is not None
    assert all(torch.isfinite(torch.tensor(v)) for v in (res.psnr_real, res.ssim_real))
    # the decoder learned the task: better than predicting the mean auxiliary image
    originals = res.images["originals"]
    mean_img = (aux.images.float() / 255).mean(0, keepdim=True).expand_as(originals)
    from osfl.privacy.metrics import psnr

    assert res.psnr_real > float(psnr(mean_img, originals).mean()) + 1.0
    # best-match scores are maxima over the synthetic reconstructions
    bp, bs = best_match_scores(originals[:2], res.images["synthetic"])
    assert float(bp[0]) == pytest.approx(res.info["psnr_synthetic_per_image"][0], rel=1e-6)
    pairs = psnr(originals[:1].expand_as(res.images["synthetic"]), res.images["synthetic"])
    assert float(bp[0]) == pytest.approx(float(pairs.max()), abs=1e-3)  # same PSNR formula
    assert float(bs[0]) <= 1.0
    assert set(res.as_dict()) >= {"psnr_real", "ssim_real", "psnr_synthetic", "ssim_synthetic"}


def test_fedpft_mixtures_are_a_synthetic_source(setup) -> None:
    ctx = setup["ctx"]
    m = FedPFT(method_config(FedPFT, {"components": 2, "max_iter": 10}), ctx.run)
    obs, data = observed(ctx, m, client=1)
    enc = token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    syn = SYNTHETIC_SOURCES.get("fedpft")(obs, enc, torch.Generator().manual_seed(0))
    assert syn.shape == (len(data), 1, 16)


def test_bad_inputs_are_refused(setup) -> None:
    ctx = setup["ctx"]
    m = FALCON(method_config(FALCON, {**FAST, "upload": "sequences"}), ctx.run)
    obs, data = observed(ctx, m)
    enc = token_encoder_from_observation(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    with pytest.raises(ConfigError, match="private"):
        run_reconstruction_attack("token_inversion", obs, ctx.splits.test, encode=enc, private=None)
    with pytest.raises(ConfigError, match="no option"):
        run_reconstruction_attack(
            "token_inversion", obs, ctx.splits.test, encode=enc, private=data, steps=3
        )
    with pytest.raises(ConfigError, match="reconstruction attack"):
        run_reconstruction_attack("dlg", obs, ctx.splits.test, encode=enc, private=data)
    other = Observation(
        0,
        0,
        upload=obs.upload,
        upload_meta=obs.upload_meta,
        hparams={**obs.hparams, "method": "fedavg"},
    )
    with pytest.raises(ConfigError, match="synthetic token source"):
        run_reconstruction_attack(
            "token_inversion", other, ctx.splits.test, encode=enc, private=data
        )
    with pytest.raises(ObservationError, match=r"hparams\.fl\.encoder"):
        token_encoder_from_observation(
            Observation(0, 0, hparams={"model": {"name": "x"}, "num_classes": 10}),
            data.image_shape,
            None,
        )
