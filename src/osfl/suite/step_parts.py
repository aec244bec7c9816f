"""The pieces the GPU suite's steps share (:mod:`osfl.suite.catalogue`): the
command line of an ``osfl run`` step, the frozen-encoder rows' paper-scale
overrides, and the dry run's tiny data and models (8-px digits, a one-block
ViT: tests/pretrain/test_pretrain.py's), which every step's ``tiny`` form reads.
"""

from __future__ import annotations

from osfl.suite.steps import DOWNSTREAM, DOWNSTREAM_DECODE

#: CIFAR-10's 60,000 images (train and test), what a step decodes from the pack.
CIFAR_ALL = 60_000
#: The suite's encoder's architecture (DeiT-Tiny's shape; ``{encoder}`` its weights).
VITT = "model.name=vit_tiny_patch16_224"
#: What every row on the suite's encoder says beside the paper's number.
BACKBONE = (
    "self-pretrained ViT-Ti/16 (osfl pretrain, supervised, CIFAR-10 classes 0-4 at 224 px, "
    "bf16 weights): not the paper's backbone"
)
FROZEN_GPU = (
    "configs/falcon_label_gpu.yaml",
    DOWNSTREAM,
    DOWNSTREAM_DECODE,
    VITT,
    "model.kwargs={pretrained: {encoder}}",
    "seeds=[0]",
    "sweep=[]",
    "method.ghofl.encoder.size=224",
)
# --- the dry run: 8-px digits, a one-block ViT (tests/pretrain/test_pretrain.py's) ----
TINY_KW = "{img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}"
TINY_RUN = (
    "data.source=digits",
    "data.image_size=8",
    "data.channels=1",
    "data.max_per_class=24",
    "data.options={}",
    "data.cache_dir=null",
    "cache_dir=null",
    "partition.num_clients=2",
    "partition.min_partition_size=5",
    "train.epochs=1",
    "train.batch_size=16",
    "device=cpu",
    "progress=false",
)
TINY_FROZEN = (
    "configs/falcon_label_gpu.yaml",
    *TINY_RUN,
    "data.classes=[5,6,7,8,9]",
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={pretrained: {encoder}, img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}",
    "seeds=[0]",
    "sweep=[]",
    "method.fedpft.encoder.size=null",
    "method.fedcgs.encoder.size=null",
    "method.falcon.encoder.size=null",
    "method.fedpft.components=2",
    "method.fedpft.max_iter=20",
)
TINY_VIT = (
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={pretrained: {encoder}, img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}",
)


def osfl_run(*overrides: str) -> tuple[str, ...]:
    """``osfl run OVERRIDES --out {out} --no-progress``: a step's command line
    (``{out}`` is the step's run directory)."""
    return ("run", *overrides, "--out", "{out}", "--no-progress")
