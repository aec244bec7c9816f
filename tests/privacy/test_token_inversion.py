"""The token-inversion attack (FALCON Table 5 shape) fed by the methods'
adapters: FALCON's rebuilds the public encoder from an Observation and reads
the synthetic sequences of either upload form, FedPFT's samples its mixtures;
the attack trains a decoder on auxiliary images and scores real vs synthetic
reconstructions — the same numbers as before the adapters moved to the
method side; bad inputs are refused clearly. (The attack on plain tensors,
with no method at all: tests/privacy/test_token_inversion_plain.py.)"""

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
from osfl.methods.falcon.inversion import FalconTokens, falcon_token_source
from osfl.methods.fedpft import FedPFT
from osfl.methods.fedpft_inversion import fedpft_token_source
from osfl.methods.frozen.inversion import token_encoder_from_observation
from osfl.privacy import (
    RECONSTRUCTION_ATTACKS,
    FixedTokens,
    ObservationError,
    TokenSource,
    run_reconstruction_attack,
)
from osfl.privacy.audit.recorder import observation_hparams
from osfl.privacy.token_inversion import TokenDecoder, best_match_scores
from support.tiny import TINY_TOKEN_INVERSION

FAST = {
    "views": {"input_size": 16, "window": 8, "stride": 8},
    "generator_model": {"depth": 1, "heads": 2, "components": 2},
    # the defaults before FALCON followed its authors' code (commit 2df7a3c):
    # the recorded scores below were taken with them
    "generator_fit": {"epochs": 3, "batch_size": 64, "keep": "last"},
    "synthetic_ratio": 1.0,
    "classifier_fit": {"epochs": 2, "batch_size": 64},
    "server_fit": {"epochs": 2, "batch_size": 64},
}
ATTACK = {"epochs": 25, "batch_size": 64, "lr": 5e-3, "width": 16, "max_targets": 12}


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    cfg = load_config(None, TINY_TOKEN_INVERSION)
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
    source = falcon_token_source(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    assert isinstance(source, TokenSource) and (source.encode.num_views, source.encode.dim) == (
        5,
        16,
    )
    syn = source.synthetic(obs, torch.Generator().manual_seed(0))
    assert syn.shape == (sum(obs.upload_meta["synthetic_counts"]), 5, 16)
    assert bool(torch.isfinite(syn).all())
    if form == "sequences":  # the uploaded tensors, class by class, as is
        ups = [obs.upload[k].float() for k in sorted(obs.upload) if k.startswith("sequences.")]
        assert torch.equal(syn, torch.cat(ups))
    else:  # seeded draws from the uploaded generator
        again = source.synthetic(obs, torch.Generator().manual_seed(0))
        assert torch.equal(syn, again)


@pytest.fixture(scope="module")
def falcon_attack(setup) -> dict[str, Any]:
    """One client's FALCON (sequences form) Observation, its adapter and the
    attack's result on it (shared: the decoder takes a few seconds)."""
    ctx = setup["ctx"]
    m = FALCON(method_config(FALCON, {**FAST, "upload": "sequences"}), ctx.run)
    obs, data = observed(ctx, m)
    aux = ctx.splits.test.subset(list(range(0, len(ctx.splits.test), 2)))
    source = falcon_token_source(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    res = run_reconstruction_attack(
        "token_inversion", obs, aux, source=source, private=data, **ATTACK
    )
    return {"obs": obs, "data": data, "aux": aux, "source": source, "res": res}


def test_attack_scores_real_and_synthetic_reconstructions(falcon_attack) -> None:
    obs, aux, res = falcon_attack["obs"], falcon_attack["aux"], falcon_attack["res"]
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


def test_the_method_adapter_gives_the_numbers_from_before(falcon_attack) -> None:
    """The scores the attack gave on this fixed input when it still read
    FALCON's upload itself (commit 45547d0: the SYNTHETIC_SOURCES registry in
    osfl.privacy), and the same result through a plain FixedTokens holding the
    adapter's sequences: the attack treats every source alike."""
    res = falcon_attack["res"]
    assert res.psnr_real == pytest.approx(22.960733, abs=1e-3)
    assert res.ssim_real == pytest.approx(0.913140, abs=1e-4)
    assert res.psnr_synthetic == pytest.approx(13.740059, abs=1e-3)
    assert res.ssim_synthetic == pytest.approx(0.481368, abs=1e-4)
    assert res.info["decoder_final_mse"] == pytest.approx(0.00321807, rel=1e-4)
    assert (res.num_targets, res.num_synthetic, res.info["method"]) == (12, 53, "falcon")
    obs, source = falcon_attack["obs"], falcon_attack["source"]
    plain = FixedTokens(source.encode, source.synthetic(obs, torch.Generator().manual_seed(0)))
    again = run_reconstruction_attack(
        "token_inversion",
        obs,
        falcon_attack["aux"],
        source=plain,
        private=falcon_attack["data"],
        **ATTACK,
    )
    assert again.as_dict() == res.as_dict()
    assert all(torch.equal(again.images[k], res.images[k]) for k in res.images)


def test_fedpft_mixtures_are_a_synthetic_source(setup) -> None:
    ctx = setup["ctx"]
    m = FedPFT(method_config(FedPFT, {"components": 2, "max_iter": 10}), ctx.run)
    obs, data = observed(ctx, m, client=1)
    source = fedpft_token_source(obs, data.image_shape, ctx.run.eval_transform, run_seed=0)
    assert isinstance(source, TokenSource)
    syn = source.synthetic(obs, torch.Generator().manual_seed(0))
    assert syn.shape == (len(data), 1, 16)
    assert torch.equal(syn, source.synthetic(obs, torch.Generator().manual_seed(0)))
    # the class mixtures sit where the client's global tokens are
    real = source.encode(data.images)[:, :1]
    assert float((syn.mean(0) - real.mean(0)).norm()) < float(real.std(0).norm())


def test_bad_inputs_are_refused(falcon_attack) -> None:
    obs, data, source = falcon_attack["obs"], falcon_attack["data"], falcon_attack["source"]
    aux = falcon_attack["aux"]
    with pytest.raises(ConfigError, match="private"):
        run_reconstruction_attack("token_inversion", obs, aux, source=source, private=None)
    with pytest.raises(ConfigError, match="no option"):
        run_reconstruction_attack("token_inversion", obs, aux, source=source, private=data, steps=3)
    with pytest.raises(ConfigError, match="reconstruction attack"):
        run_reconstruction_attack("dlg", obs, aux, source=source, private=data)
    with pytest.raises(ConfigError, match="TokenSource"):  # an encoder is not a source
        run_reconstruction_attack("token_inversion", obs, aux, source=source.encode, private=data)
    other = Observation(
        0,
        0,
        upload=obs.upload,
        upload_meta=obs.upload_meta,
        hparams={**obs.hparams, "method": "fedavg"},
    )
    with pytest.raises(ObservationError, match=r"hparams\.method"):
        run_reconstruction_attack("token_inversion", other, aux, source=source, private=data)
    broken = Observation(
        0, 0, upload={"generator": torch.zeros(3)}, upload_meta={}, hparams=obs.hparams
    )
    with pytest.raises(ObservationError, match=r"upload\.generator"):
        FalconTokens(source.encode).synthetic(broken, torch.Generator())
    with pytest.raises(ObservationError, match=r"hparams\.fl\.encoder"):
        token_encoder_from_observation(
            Observation(0, 0, hparams={"model": {"name": "x"}, "num_classes": 10}),
            data.image_shape,
            None,
        )


def test_fedpft_draws_count_per_class_and_skip_empty_classes() -> None:
    """``n_c`` draws from each uploaded mixture, in class order; a class with
    no images, or with no mixture, gives none; nothing uploaded gives (0, 1, D)."""
    from types import SimpleNamespace

    from osfl.methods.fedpft import sample_gmm_rows
    from osfl.methods.fedpft_inversion import VAR_FLOOR, FedPFTTokens

    d = 3
    rows = {k: torch.tensor([[1.0, *([float(10 * k)] * d), *([0.01] * d)]]) for k in range(4)}
    obs = Observation(0, 0, upload={f"gmm.{k}": rows[k] for k in (0, 1, 3)},
                      upload_meta={"class_counts": [2, 0, 4, 1]}, hparams={"method": "fedpft"})  # fmt: skip
    tokens = FedPFTTokens(SimpleNamespace(dim=d))
    syn = tokens.synthetic(obs, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    expect = torch.cat([sample_gmm_rows(rows[0], 2, g, VAR_FLOOR),
                        sample_gmm_rows(rows[3], 1, g, VAR_FLOOR)])[:, None]  # fmt: skip
    assert syn.shape == (3, 1, d) and torch.equal(
        syn, expect
    )  # class 1: 0 images; class 2: no rows
    empty = tokens.synthetic(Observation(0, 0, upload_meta={"class_counts": [0, 0]}),
                             torch.Generator())  # fmt: skip
    assert empty.shape == (0, 1, d) and empty.dtype == torch.float32


def test_fedpft_token_source_builds_its_encoder_on_the_device(monkeypatch) -> None:
    import osfl.methods.fedpft_inversion as fpi

    seen = {}

    def fake(obs, image_shape, transform, *, run_seed=None, device="cpu"):
        seen.update(run_seed=run_seed, device=device)
        return "encoder"

    monkeypatch.setattr(fpi, "token_encoder_from_observation", fake)
    source = fpi.fedpft_token_source(Observation(0, 0), (1, 8, 8), None, run_seed=4, device="meta")
    assert seen == {"run_seed": 4, "device": "meta"} and source.encode == "encoder"
