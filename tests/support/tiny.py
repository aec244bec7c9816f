"""Tiny tasks (config overrides for ``load_config``), the shared helpers that
build a run on them, and the reference tests' tolerance.

One name per distinct task: ``TINY`` is the default 8-px CNN task (the root
conftest's ``tiny_data``/``make_ctx``), ``TINY_VIT`` the one-block ViT task
(``tests/methods/conftest.py``'s ``tiny``); the others are variants one
family or file uses, named after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.data.federation import Federation
from osfl.methods.falcon import FALCON
from osfl.models import create_model

TINY = [
    "data.image_size=8",
    "data.max_per_class=20",
    "model.kwargs={width: 8}",
    "train.epochs=2",
    "train.batch_size=16",
    "progress=false",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
    "threads_per_client=1",  # tiny models: one thread is fastest, and it is robust to load
]
TINY_VIT = [
    "data.image_size=16",
    "data.max_per_class=15",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.min_partition_size=3",
    "progress=false",
    "cache_dir=null",
]
TINY_FEDPFT = [
    "data.image_size=16",
    "data.max_per_class=12",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.num_clients=3",
    "partition.alpha=0.3",
    "partition.min_partition_size=5",
    "progress=false",
    "cache_dir=null",
]
FAST_FEDPFT = {
    "components": 4,
    "max_iter": 30,
    "tol": 1e-3,
    "server_fit": {"epochs": 5, "lr": 0.01},
}
TINY_FALCON = [
    "data.image_size=16",
    "data.max_per_class=12",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.num_clients=3",
    "partition.alpha=0.5",
    "partition.min_partition_size=5",
    "progress=false",
    "cache_dir=null",
]
FAST_FALCON = {
    "views": {"input_size": 16, "window": 8, "stride": 8},
    "generator_model": {"depth": 1, "heads": 2, "components": 2},
    "generator_fit": {"epochs": 3, "batch_size": 64},
    "classifier_fit": {"epochs": 3, "batch_size": 64},
    "server_fit": {"epochs": 3, "batch_size": 64},
}
TINY_FROZEN = [
    "data.image_size=16",
    "data.max_per_class=10",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, patch_size: 8, depth: 1, embed_dim: 16, num_heads: 2}",
    "partition.num_clients=3",
    "partition.alpha=0.5",
    "partition.min_partition_size=5",
    "progress=false",
]
TINY_TOKEN_INVERSION = [
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
TINY_PROVENANCE = [
    "data.image_size=8",
    "data.max_per_class=10",
    "partition.num_clients=2",
    "train.epochs=1",
    "methods=[fedavg]",
    "threads_per_client=1",
    "cache_dir=null",
    "progress=false",
]
TINY_RECORD = [
    "data.image_size=8",
    "data.max_per_class=10",
    "partition.num_clients=2",
    "train.epochs=1",
    "threads_per_client=1",
    "cache_dir=null",
    "progress=false",
]
# digits at 8 px, 3 clients, 2 rounds of SCAFFOLD with plain SGD: the audited
# run (the label attacks read its recorded observations); its users add the epochs
TINY_SCAFFOLD = [
    "data.image_size=8",
    "data.max_per_class=12",
    "partition.num_clients=3",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
    "methods=[scaffold]",
    "method.scaffold.rounds=2",
    "train.batch_size=8",
    "train.optimizer=sgd",
    "train.lr=0.05",
    "cache_dir=null",
    "device=cpu",
]
TINY_SPLIT = [
    "data.image_size=8",
    "data.max_per_class=20",
    "partition.num_clients=2",
    "cache_dir=null",
]
TINY_FLOWER_STATUS = ("partition.num_clients=2", "train.epochs=1", "data.max_per_class=10")
TINY_FLOWER_SECURITY = (
    "data.image_size=8",
    "partition.num_clients=2",
    "partition.alpha=1.0",
    "train.epochs=1",
    "cache_dir=null",
)


# two clients of a width-4 CNN, fedavg and ensemble: a run stopped and resumed
# (tests/test_runner.py)
TINY_RESUME = [
    "data.image_size=8",
    "partition.num_clients=2",
    "model.kwargs={width: 4}",
    "train.epochs=1",
    "train.batch_size=64",
    "methods=[fedavg,ensemble]",
    "threads_per_client=1",
]


# three clients at 8 px, two epochs: a Flower run whose processes are stopped
# (tests/flower/test_faults.py)
TINY_FAULTS = [
    "data.image_size=8",
    "data.max_per_class=20",
    "partition.num_clients=3",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
    "train.epochs=2",
    "train.batch_size=16",
    "cache_dir=null",
]


# three clients at 8 px, two rounds of fedavg: a Flower run whose nodes claim
# another site (tests/flower/test_site_claims.py)
TINY_SITE_CLAIMS = [
    "data.image_size=8",
    "data.max_per_class=20",
    "partition.num_clients=3",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
    "methods=[fedavg]",
    "method.fedavg.rounds=2",
    "train.epochs=1",
    "train.batch_size=16",
    "cache_dir=null",
]


# FedMITR's end-to-end task: a one-block grey-scale ViT on 8-px digits, three
# clients, ten AdamW epochs (tests/methods/fedmitr/test_method.py)
TINY_FEDMITR = [
    "partition.num_clients=3",
    "partition.alpha=1.0",
    "train.epochs=10",
    "train.optimizer=adamw",
    "train.lr=0.003",
    "train.weight_decay=0.01",
    "data.image_size=8",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, in_chans: 1, depth: 1, embed_dim: 32, num_heads: 2}",
    "progress=false",
    "device=cpu",
]


# FedMITR's options task: a narrower one-block ViT, two clients, one epoch
# (tests/methods/fedmitr/test_options.py)
TINY_FEDMITR_OPTIONS = [
    "partition.num_clients=2",
    "partition.alpha=1.0",
    "data.max_per_class=20",
    "train.epochs=1",
    "train.optimizer=adamw",
    "data.image_size=8",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={img_size: 8, in_chans: 1, depth: 1, embed_dim: 16, num_heads: 2}",
    "progress=false",
    "device=cpu",
    "cache_dir=null",
]


# the server-distillation methods' task: three clients at 8 px, eight epochs
# (tests/methods/kd/test_methods.py)
TINY_KD = [
    "partition.num_clients=3",
    "partition.alpha=1.0",
    "train.epochs=8",
    "data.image_size=8",
    "progress=false",
    "device=cpu",
]


# the saved-split task: 20 images a class, partitions of two at least
# (tests/data/test_saved_split.py)
TINY_SAVED_SPLIT = ["data.max_per_class=20", "partition.min_partition_size=2"]

# grey 8-px digits (one channel), three clients: the real sites' and
# SecAgg+'s runs, normalised by their own transform.mean/std
TINY_GREY = ["data.image_size=8", "data.channels=1", "partition.num_clients=3"]
# two clients, 10 images a class: an audited run on the (simulated) device
TINY_DEVICE = ["data.image_size=8", "data.max_per_class=10", "partition.num_clients=2"]
# six clients, 30 images a class: uploads fuzzed in a real round
TINY_FUZZ = [
    "data.image_size=8",
    "data.max_per_class=30",
    "partition.num_clients=6",
    "partition.alpha=1.0",
    "partition.min_partition_size=5",
]
# three clients at 8 px: Flower's loopback and SecAgg+ runs
TINY_FLOWER = ["data.image_size=8", "partition.num_clients=3", "partition.alpha=1.0"]
# FAFI end to end: the width-8 CNN at 8 px, alpha 0.5
TINY_FAFI_E2E = ["data.image_size=8", "model.kwargs={width: 8}", "partition.alpha=0.5"]
# FAFI's code variant: three clients, 30 images a class
TINY_FAFI_CODE = [
    "data.image_size=8",
    "data.max_per_class=30",
    "model.kwargs={width: 8}",
    "partition.num_clients=3",
    "partition.alpha=1.0",
]
# FAFI's held prototypes: three clients split at alpha 0.1 (absent classes)
TINY_FAFI_SKEWED = [
    "data.image_size=8",
    "data.max_per_class=20",
    "model.kwargs={width: 8}",
    "partition.num_clients=3",
    "partition.alpha=0.1",
    "partition.min_partition_size=5",
]
# the baselines that must beat chance: 16-px digits, four clients
TINY_BASELINES = [
    "data.image_size=16",
    "data.max_per_class=50",
    "partition.num_clients=4",
    "partition.alpha=0.5",
]
# a federated run from a pretrained ViT encoder: two clients at 8 px
TINY_PRETRAINED_RUN = [
    "model.name=vit_tiny_patch2_16",
    "data.image_size=8",
    "data.max_per_class=30",
    "partition.num_clients=2",
]
# a ViT run on five of the ten digits (as many classes as the encoder's head)
TINY_PRETRAINED_FIVE = [
    "model.name=vit_tiny_patch2_16",
    "data.image_size=8",
    "data.max_per_class=30",
    "data.classes=[5,6,7,8,9]",
]
# 8 images a class: the run whose command line the record keeps
TINY_COMMAND_LINE = [
    "data.max_per_class=8",
    "partition.alpha=1.0",
    "partition.min_partition_size=2",
]
# two clients, 10 images a class: several seeds run one after another
TINY_TWO_CLIENTS = [
    "data.image_size=8",
    "data.max_per_class=10",
    "partition.num_clients=2",
    "partition.alpha=1.0",
    "partition.min_partition_size=2",
]


def load_tiny(overrides: list[str]) -> tuple[Any, Any]:
    """The config of ``overrides`` and its data splits (the ``tiny`` fixtures)."""
    cfg = load_config(None, overrides)
    return cfg, load_splits(cfg)


def seed_ctx(tiny: Any, federation: Federation | None = None) -> SeedContext:
    cfg, splits = tiny
    fed = federation or build_federation(cfg, splits.train, 0)
    return SeedContext(splits, fed, build_run(cfg, splits, fed, 0))


def split_ctx(
    tiny: Any,
    num_clients: int,
    alpha: float | None,
    scheme: str = "dirichlet",
    federation: Federation | None = None,
) -> SeedContext:
    cfg, splits = tiny
    part = dataclasses.replace(cfg.partition, num_clients=num_clients, alpha=alpha, scheme=scheme)
    c = dataclasses.replace(cfg, partition=part)
    fed = federation or build_federation(c, splits.train, 0)
    return SeedContext(splits, fed, build_run(c, splits, fed, 0))


def falcon(ctx: SeedContext, **over: Any) -> FALCON:
    return FALCON(method_config(FALCON, {**FAST_FALCON, **over}), ctx.run)


def blobs(seed: int, per_class: int, classes: int = 4, dim: int = 6) -> tuple[torch.Tensor, ...]:
    """Gaussian classes with different covariances, overlapping enough that
    a head is not trivially perfect; float64."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 1.5
    mix = torch.randn(classes, dim, dim, generator=torch.Generator().manual_seed(98)) * 0.5
    f = torch.cat(
        [
            means[c] + torch.randn(per_class, dim, generator=g) @ (torch.eye(dim) + mix[c])
            for c in range(classes)
        ]
    ).double()
    return f, torch.arange(classes).repeat_interleave(per_class)


def close(ours: torch.Tensor, theirs: torch.Tensor, rel: float = 1e-9) -> None:
    """Equal to ``rel`` of the largest magnitude of ``theirs`` (float64
    rounding differs by summation order only): the reference tests' tolerance."""
    scale = float(theirs.abs().max()) or 1.0
    np.testing.assert_allclose(
        ours.double().numpy(), theirs.double().numpy(), rtol=0, atol=rel * scale
    )


def tiny_vit(seed: int = 0, num_classes: int = 5, **kwargs: object):
    """FedMITR's tiny ViT: 8x8 images, 2-px patches -> 4x4 = 16 patches, 5 classes."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    return create_model(
        "vit_tiny_patch2_16",
        num_classes=num_classes,
        img_size=8,
        in_chans=3,
        depth=2,
        embed_dim=16,
        num_heads=2,
        **kwargs,
    ).eval()
