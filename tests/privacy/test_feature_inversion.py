"""Feature inversion of EFTViT uploads (§3.6, Fig. 5): a decoder trained on
auxiliary images inverts the local module's patch features; masked features
give worse reconstructions than unmasked ones, and a local module that
drifted from the one the decoder was trained on gives worse ones still."""

from __future__ import annotations

import copy

import pytest
import torch

from osfl.data import load_data
from osfl.errors import ConfigError
from osfl.methods.eftvit import pack_features
from osfl.models import create_model
from osfl.privacy.feature_inversion import (
    DecoderConfig,
    FeatureDecoder,
    inversion_curve,
    invert_upload,
    match_scores,
    score_upload,
    train_feature_decoder,
)
from osfl.privacy.metrics import psnr


@pytest.fixture(scope="module")
def setup() -> dict:
    splits = load_data("digits", image_size=16, max_per_class=40)
    images = splits.train.images.float() / 255
    torch.manual_seed(0)
    vit = create_model(
        "vit_tiny_patch2_16", in_chans=1, patch_size=4, depth=2, embed_dim=48, num_heads=2
    )
    bottom, _ = vit.split(1)
    bottom.eval()
    kw = dict(embed_dim=48, grid=(4, 4), patch=(4, 4))
    small = dict(width=48, depth=1, heads=2, steps=250, batch_size=64, lr=4e-3)
    masked = train_feature_decoder(
        bottom, images[:300], cfg=DecoderConfig(mask_ratio=0.75, **small), **kw
    )
    unmasked = train_feature_decoder(
        bottom, images[:300], cfg=DecoderConfig(mask_ratio=0.0, **small), **kw
    )
    held = images[300:380]
    return {
        "bottom": bottom,
        "masked": masked,
        "unmasked": unmasked,
        "held": held,
        "labels": splits.train.labels[300:380],
    }


def test_decoder_maps_any_number_of_tokens_to_an_image() -> None:
    dec = FeatureDecoder(48, (4, 4), (4, 4), 3, width=32, depth=1, heads=2)
    for t in (1, 5, 17):
        with torch.no_grad():
            out = dec(torch.randn(2, t, 48))
        assert out.shape == (2, 3, 16, 16) and float(out.min()) >= 0 and float(out.max()) <= 1


def test_masking_makes_inversion_worse_than_on_unmasked_features(setup: dict) -> None:
    held, bottom = setup["held"], setup["bottom"]
    masked = inversion_curve(setup["masked"], {0: bottom}, held, num_patches=16, mask_ratio=0.75)
    unmasked = inversion_curve(setup["unmasked"], {0: bottom}, held, num_patches=16, mask_ratio=0.0)
    mean_image = held.mean(0, keepdim=True).expand_as(held)
    baseline = float(psnr(mean_image, held).mean())
    assert unmasked[0]["psnr"] > baseline + 1.0  # the attack works on unmasked features
    assert unmasked[0]["psnr"] > masked[0]["psnr"] + 0.5  # masking hides content
    assert unmasked[0]["ssim"] > masked[0]["ssim"]


def test_a_drifted_local_module_is_harder_to_invert(setup: dict) -> None:
    drifted = copy.deepcopy(setup["bottom"])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in drifted.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=g))
    curve = inversion_curve(
        setup["unmasked"],
        {0: setup["bottom"], 5: drifted},
        setup["held"],
        num_patches=16,
        mask_ratio=0.0,
    )
    assert [c["round"] for c in curve] == [0, 5]
    assert curve[1]["psnr"] < curve[0]["psnr"]


def test_inverting_a_recorded_upload(setup: dict) -> None:
    held, labels = setup["held"], setup["labels"]
    keep = torch.arange(4).expand(len(held), -1)
    with torch.no_grad():
        tokens = setup["bottom"](held, keep)
    per_class = {int(c): tokens[labels == c][:3] for c in labels.unique()}
    upload = pack_features(per_class, 10, 3)
    rec = invert_upload(setup["masked"], upload.tensors)
    assert sorted(rec) == sorted(per_class)
    assert all(rec[c].shape == (len(per_class[c]), 1, 16, 16) for c in rec)
    score = score_upload(setup["masked"], upload.tensors, held, labels)
    assert score["pairs"] == sum(len(v) for v in per_class.values())
    assert 0 < score["psnr"] < 60 and -1 <= score["ssim"] <= 1
    exact = match_scores(held[:5], held[:5].flip(0))
    assert exact["psnr"] == pytest.approx(100.0, abs=1e-3) or exact["psnr"] > 60  # perfect pairing
    with pytest.raises(ConfigError):
        match_scores(held[:2], torch.zeros(2, 3, 16, 16))
