"""The GPU suite's other paper rows, one builder each: RLU Table 2 and Fig. 1
(Chen & Vikalo, through ``benchmarks/repro_rlu.py``), the encoder every
frozen-encoder row needs, FedMITR Table I, FALCON Table 2 with the
closed-form heads (FedPFT, FedCGS, GH-OFL), EFTViT Table 1 (one step per
method) and the MFU benchmark (issues #32, #50). :mod:`osfl.suite.catalogue`
puts them in order of value.

**What the encoder rows are comparable with** (issue #50). FedMITR, FALCON,
the closed-form heads and EFTViT run on the suite's own encoder: a ViT-Ti/16
(DeiT-Tiny's shape, FedMITR's paper backbone) pretrained from scratch by
``osfl pretrain`` on CIFAR-10 classes 0-4 and stored in bf16, on the other
five classes. Their rows compare the methods with each other on one
backbone and one task (a method's gain over FedAvg, their order); they are
not the papers' settings (ImageNet DeiT-Tiny, DINOv2-B, ViT-B/16 from
ImageNet-21k, all ten classes), and every row says so
(:data:`~osfl.suite.step_parts.BACKBONE`) beside the paper's number.
"""

from __future__ import annotations

from collections.abc import Mapping

from osfl.suite.step_parts import (
    BACKBONE,
    CIFAR_ALL,
    FROZEN_GPU,
    TINY_FROZEN,
    TINY_KW,
    TINY_RUN,
    TINY_VIT,
    VITT,
    osfl_run,
)
from osfl.suite.steps import (
    DOWNSTREAM,
    DOWNSTREAM_DECODE,
    ENCODER,
    ENCODER_STEP,
    FORWARD,
    RESIZE_448,
    UPSTREAM_DECODE,
    VGG16_PER_R18,
    VITB_PER_VITS,
    Step,
    Work,
)

#: A dry run's RLU data: 1-channel digits at 16 px (LeNet-5's least), 12
#: train and 6 test images per class.
_RLU_TINY = (
    "data.spec=digits",
    "data.image_size=16",
    "data.channels=1",
    "data.max_per_class=12",
    "data.test_max_per_class=6",
    "data.cache_dir=null",
    "aux_per_class=3",
    "attack_clients=2",
    "rlu.num_samples=128",
    "device=cpu",
)
_RLU_PAPER_NOTE = "RLU Table 2, CIFAR-10, Dir(0.5), untrained models, iAcc (fraction)"


def rlu_step(which: str) -> Step:
    """RLU (Chen & Vikalo) through ``benchmarks/repro_rlu.py`` at the paper's
    models and batch sizes; the attacks' Monte Carlo is CPU-bound, so its
    fixed cost is a guess from the cpu run (1,273 s for Table 2 on two loaded
    cores, half the clients and 4,096 samples): the first GPU job measures it."""
    table2 = which == "table2"
    config = "configs/rlu_table2_gpu.yaml" if table2 else "configs/rlu_fig1_gpu.yaml"
    tiny_extra = (
        ("settings=[{model: lenet5, act: relu, batch_size: 8}]", "steps=[1,2]")
        if table2
        else (
            "setting={model: lenet5, act: relu, batch_size: 8}",
            "steps=2",
            "rounds=2",
            "eval_rounds=[0,1]",
            "train_eval_size=20",
        )
    )
    vgg = (4 * 10 * 11 * 64) if table2 else (100 * 10 * 10 * 64)  # image-steps of VGG-16
    return Step(
        name="rlu_t2" if table2 else "rlu_fig1",
        section="rlu",
        kind="script",
        argv=("script", "benchmarks/repro_rlu.py", which, config, "threads=8", "out_dir={out}"),
        tiny=(
            "script",
            "benchmarks/repro_rlu.py",
            which,
            config,
            *_RLU_TINY,
            *tiny_extra,
            "out_dir={out}",
        ),
        work=Work(
            {"resnet18_32": VGG16_PER_R18 * vgg, "decode": CIFAR_ALL},
            fixed_s=240.0,
            note="the attacks' Monte Carlo (CPU): guessed, not measured",
        ),
        tiny_work=Work({"decode": 200.0}, fixed_s=5.0),
        paper={
            "rlu vgg16 relu B64 m1": 1.0,
            "rlu vgg16 relu B64 m10": 0.946,
            "rlu vgg16 elu B64 m1": 0.996,
            "rlu vgg16 elu B64 m10": 0.923,
        }
        if table2
        else {},
        paper_note=_RLU_PAPER_NOTE
        if table2
        else "RLU Fig. 1, CIFAR-10, VGG-16, FedAvg 100 rounds, iAcc while the model trains",
        scale_note="the paper's setting: full CIFAR-10, all 10 clients attacked, "
        "100 auxiliary images per class, 10,000 samples",
    )


# ---------------------------------------------------------------- frozen encoder
_CIFAR5_224 = 30_000  # classes 0-4 or 5-9 of CIFAR-10: 25,000 train + 5,000 test
FROZEN_IMAGES = 7_500  # classes 5-9 at 1,000 / 500 per class (falcon_label_gpu.yaml)


def pretrain_step() -> Step:
    """The encoder (configs/pretrain_cifar5_vitti_gpu.yaml): a ViT-Ti/16, whose
    bf16 weights and card come back in the bundle (``returns``) and, once
    imported, are read from the repository by every later lease."""
    card = ENCODER.removesuffix(".safetensors") + ".card.json"
    return Step(
        name=ENCODER_STEP,
        section="pretrain",
        kind="pretrain",
        argv=(
            "pretrain",
            "configs/pretrain_cifar5_vitti_gpu.yaml",
            UPSTREAM_DECODE,
            "--out",
            f"{{out}}/{ENCODER}",
            "--force",
            "--no-progress",
        ),
        tiny=(
            "pretrain",
            "upstream.classes=[0,1,2,3,4]",
            "model.name=vit_tiny_patch2_16",
            f"model.kwargs={TINY_KW}",
            "upstream.image_size=8",
            "upstream.max_per_class=40",
            "upstream.cache_dir=null",
            "train.epochs=1",
            "train.batch_size=32",
            "warmup_epochs=0",
            "probe_max_per_class=20",
            "supervised.augment=none",
            "device=cpu",
            "--upstream",
            "digits",
            "--out",
            f"{{out}}/{ENCODER}",
            "--force",
            "--no-progress",
        ),
        # 60 epochs of 25,000 images; the probe's features; 30,000 images decoded
        # and upsampled (the ViT-S/16 on an H200: 5.1 s per epoch, 53 s of set-up)
        work=Work(
            {
                "vitti16_224": 60 * 25_000 + FORWARD * 30_000,
                "decode": _CIFAR5_224,
                "resize_224": _CIFAR5_224,
            },
            fixed_s=10.0,
        ),
        paper_note="no paper number: the encoder the FedMITR, FALCON and EFTViT rows use",
        scale_note="ViT-Ti/16 at 224 px, supervised from scratch, CIFAR-10 classes 0-4 "
        "(25,000 images), 60 epochs; weights kept in bf16",
        returns=(ENCODER, card),
        post="encoder_bf16",
    )


def frozen_step(
    name: str,
    methods: str,
    paper: Mapping[str, float],
    work: Work,
    tiny_extra: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Step:
    return Step(
        name=name,
        section="frozen",
        kind="run",
        argv=osfl_run(*FROZEN_GPU, "partition.alpha=0.1", methods, *extra),
        tiny=osfl_run(*TINY_FROZEN, "partition.alpha=0.1", methods, *tiny_extra),
        work=work,
        needs=(ENCODER_STEP,),
        paper=paper,
        paper_note="FALCON Table 2, Tiny-ImageNet, α 0.1 (DINOv2-B at 448 px); no CIFAR row",
        scale_note="substitutes: CIFAR-10 classes 5-9 at 448 px (1,000 / 500 per class) for "
        "Tiny-ImageNet, the suite's ViT-Ti/16 at 224-px views for DINOv2-B: the methods "
        "compare with each other, not with the paper's numbers",
        row="falcon_t2_a0.1",
        backbone=BACKBONE,
    )


FROZEN_DATA = {"decode": FROZEN_IMAGES, "resize_224": RESIZE_448 * FROZEN_IMAGES}


def fedmitr_step() -> Step:
    """FedMITR Table I at α 0.1: the clients fine-tune the suite's encoder
    (DeiT-Tiny's shape; no ImageNet DeiT-Tiny travels) on CIFAR-10 classes
    5-9 at 224 px for 10 epochs, the server distils for 5 rounds of 100
    inversion iterations of batch 64 through the 10 teachers and the student."""
    clients = 10 * 25_000
    inversion = 5 * 100 * 64 * 11  # rounds x iterations x batch x (teachers + student)
    return Step(
        name="fedmitr_t1_a0.1_seed0",
        section="fedmitr",
        kind="run",
        argv=osfl_run(
            "configs/fedmitr_cifar10_gpu.yaml",
            DOWNSTREAM,
            DOWNSTREAM_DECODE,
            VITT,
            "model.kwargs={pretrained: {encoder}}",
            "partition.alpha=0.1",
            "sweep=[]",
            "seeds=[0]",
            "methods=[fedavg,ensemble,adi,fedmitr]",
            "train.epochs=10",
            "method.fedmitr.epochs=5",
            "method.adi.epochs=5",
        ),
        tiny=osfl_run(
            "configs/fedmitr_cifar10_gpu.yaml",
            *TINY_RUN,
            "data.classes=[5,6,7,8,9]",
            *TINY_VIT,
            "partition.alpha=0.1",
            "sweep=[]",
            "seeds=[0]",
            "methods=[fedavg,fedmitr]",
            "method.fedmitr.epochs=1",
            "method.fedmitr.synthesis_batch_size=8",
            "method.fedmitr.inversion.iterations=2",
        ),
        work=Work(
            {
                "vitti16_224": clients + 2 * inversion + 4 * FORWARD * 5_000,
                "decode": _CIFAR5_224,
                "resize_224": _CIFAR5_224,
            },
            fixed_s=20.0,
        ),
        needs=(ENCODER_STEP,),
        paper={"fedavg": 24.30, "adi": 33.77, "fedmitr": 36.97},
        paper_note="FedMITR Table I, CIFAR-10, α 0.1 (10 clients, ImageNet DeiT-Tiny, 50 epochs)",
        scale_note="substitutes: the suite's ViT-Ti/16 (DeiT-Tiny's shape, pretrained on "
        "CIFAR-10 classes 0-4) for ImageNet DeiT-Tiny, classes 5-9 (5-way); 10 local epochs, "
        "5 server rounds (paper: 50, 20): the methods compare with each other, not with "
        "the paper's numbers",
        row="fedmitr_t1_a0.1",
        backbone=BACKBONE,
    )


def eftvit_step(method: str) -> Step:
    """EFTViT Table 1 at β 0.1, one method per step: 100 rounds (the
    paper's), 10 of 100 clients per round, 2 local epochs of their 250
    images, an evaluation of 5,000 test images every round."""
    rounds = 100
    per_round = 10 * 2 * 250 + FORWARD * 5_000
    return Step(
        name=f"eftvit_t1_b0.1_{method}",
        section="eftvit",
        kind="run",
        argv=osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            DOWNSTREAM,
            DOWNSTREAM_DECODE,
            VITT,
            "model.kwargs={pretrained: {encoder}}",
            "partition.alpha=0.1",
            "sweep=[]",
            f"methods=[{method}]",
            f"method.{method}.rounds={rounds}",
        ),
        tiny=osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            *TINY_RUN,
            "data.classes=[5,6,7,8,9]",
            "model.name=vit_tiny_patch2_16",
            "model.kwargs={pretrained: {encoder}, img_size: 8, patch_size: 2, depth: 2, embed_dim: 32, num_heads: 2, in_chans: 1}",
            "partition.alpha=0.1",
            "sweep=[]",
            f"methods=[{method}]",
            f"method.{method}.rounds=2",
            f"method.{method}.client_fraction=1.0",
            *(("method.eftvit.local_depth=1",) if method == "eftvit" else ()),
            "transform.train=none",
        ),
        work=Work(
            {"vitti16_224": rounds * per_round, "decode": _CIFAR5_224, "resize_224": _CIFAR5_224},
            fixed_s=15.0,
        ),
        needs=(ENCODER_STEP,),
        paper={"fedhead": 92.27, "fedlora": 96.91, "eftvit": 98.12},
        paper_note="EFTViT Table 1, CIFAR-10, β 0.1 (ViT-B/16 ImageNet-21k, 100 rounds)",
        scale_note="substitutes: the suite's ViT-Ti/16 for ViT-B/16 ImageNet-21k (330 MiB, "
        "over the 64 MiB carried), CIFAR-10 classes 5-9; the paper's 100 rounds: the "
        "methods compare with each other, not with the paper's numbers",
        row="eftvit_t1_b0.1",
        backbone=BACKBONE,
    )


#: The MFU step's set-ups, timed one after the other in one call (issue #50).
MFU_VARIANTS = "eager,fused,fused+compile,fused+compile+b256"
#: Seconds of one ``torch.compile`` of ViT-B/16's step (a guess until a
#: lease measures the step; the b256 variant compiles again for its shape).
_COMPILE_GUESS_S = 60.0


def mfu_step() -> Step:
    """MFU of a ViT-B/16 bf16 training step, as :data:`MFU_VARIANTS`: the
    first lease's eager step, AdamW's fused kernel, ``torch.compile``, batch
    256; each timed (:mod:`osfl.suite.mfu`)."""
    steps = 30 + 3 + 1  # timed, warm-up, the first (or the compilation)
    images = steps * (3 * 128 + 256) + 128 + 256  # the variants, and the FLOP counts
    return Step(
        name="mfu_vitb16_bf16",
        section="mfu",
        kind="mfu",
        argv=(
            "suite",
            "mfu",
            "--model",
            "vit_base_patch16_224",
            "--batch",
            "128",
            "--steps",
            "30",
            "--dtype",
            "bfloat16",
            "--variants",
            MFU_VARIANTS,
            "--out",
            "{out}",
        ),
        tiny=(
            "suite",
            "mfu",
            "--model",
            "vit_tiny_patch2_16",
            "--img-size",
            "8",
            "--batch",
            "4",
            "--steps",
            "2",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--variants",
            "eager,fused+b8",
            "--out",
            "{out}",
        ),
        work=Work(
            {"vits16_224": VITB_PER_VITS * images},
            fixed_s=10.0 + 2 * _COMPILE_GUESS_S,
            note="torch.compile's two compilations: guessed, not measured",
        ),
        tiny_work=Work({"vits16_224": 32.0}, fixed_s=1.0),
        paper={"mfu": 40.0},
        paper_note="the issue's target: at least 40 % of the GPU's dense bf16 peak",
        scale_note="ViT-B/16, 224 px, bf16 autocast, forward + backward + AdamW; variants "
        f"{MFU_VARIANTS} (batch 128 unless bN)",
    )
