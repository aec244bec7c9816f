"""The tiny pretraining task: a one-block ViT on 8-px digits."""

from __future__ import annotations

from osfl.pretrain.config import load_pretrain_config
from osfl.pretrain.upstream import load_upstream

#: A one-block ViT on 8-px digits (16 tokens of 2-px patches): ~1 s per epoch.
KWARGS = "{img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}"
TINY_PRETRAIN = [
    "model.name=vit_tiny_patch2_16",
    f"model.kwargs={KWARGS}",
    "upstream.image_size=8",
    "upstream.max_per_class=40",
    "upstream.cache_dir=null",
    "train.batch_size=32",
    "train.lr=0.003",
    "warmup_epochs=0",
    "probe_max_per_class=20",
    "supervised.augment=none",  # pad-4 crops would erase 8-px digits
    "dino.out_dim=64",
    "dino.hidden_dim=64",
    "dino.bottleneck_dim=16",
    "mae.decoder_dim=16",
    "mae.decoder_heads=2",
]


def tiny_cfg(*extra: str):
    return load_pretrain_config(None, [*TINY_PRETRAIN, "upstream.source=digits", *extra])


def digits_upstream(cfg):
    u = cfg.upstream
    return load_upstream(
        u.source, u.classes, image_size=u.image_size, max_per_class=u.max_per_class
    )
