"""The catalogue of the GPU suite: the paper-scale runs a lent GPU should
make, in order of value (issues #32, #40).

``STEPS`` is the catalogue in the issue's order of value, one headline row
per seed paper, each split into steps of at most 8 minutes at the H100's
expected rates: FAFI Table 1 at α 0.1 (the paper's 50- and 100-epoch FAFI
numbers first, as cheap rows; then the CE clients' and the SALT clients'
training as separate steps sharing the client cache, the SALT clients in
two ``train_clients`` parts before the step that finds them all cached), RLU Table 2 and
Fig. 1, the encoder every frozen-encoder row needs, FedMITR Table I, FALCON
Table 2 with the closed-form heads, EFTViT Table 1 (one step per method),
the MFU benchmark, then more FAFI seeds. A step that uses some of
CIFAR-10's classes decodes only those from the pack (the image folder's
``classes`` option beside its ``data.classes``). Each step has a ``tiny``
form on digits (8 px; 16 px, LeNet-5's least, for the RLU scripts) that
``--dry-run`` runs on a CPU through the very same path.

Why one file over 500 lines: it is data, one builder per paper's row, and
the order of value (``STEPS`` at the end) is read against all of them at
once; split per paper, each file would import the shared command pieces
above and the order would live apart from what it orders.
"""

from __future__ import annotations

from collections.abc import Mapping

from osfl.suite.steps import (
    DOWNSTREAM,
    DOWNSTREAM_DECODE,
    ENCODER,
    FORWARD,
    RESIZE_448,
    UPSTREAM_DECODE,
    VGG16_PER_R18,
    VITB_PER_VITS,
    Step,
    Work,
)

_VITS = "model.name=vit_small_patch16_224"
_FROZEN_GPU = (
    "configs/falcon_label_gpu.yaml",
    DOWNSTREAM,
    DOWNSTREAM_DECODE,
    _VITS,
    "model.kwargs={pretrained: {encoder}}",
    "seeds=[0]",
    "sweep=[]",
    "method.ghofl.encoder.size=224",
)
# --- the dry run: 8-px digits, a one-block ViT (tests/test_pretrain.py's) ----
_TINY_KW = "{img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}"
_TINY_RUN = (
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
_TINY_FROZEN = (
    "configs/falcon_label_gpu.yaml",
    *_TINY_RUN,
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
_TINY_VIT = (
    "model.name=vit_tiny_patch2_16",
    "model.kwargs={pretrained: {encoder}, img_size: 8, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}",
)


def _osfl_run(*overrides: str) -> tuple[str, ...]:
    """``osfl run OVERRIDES --out {out} --no-progress``: a step's command line
    (``{out}`` is the step's run directory)."""
    return ("run", *overrides, "--out", "{out}", "--no-progress")


def _falcon_fit(epochs: tuple[int, int, int]) -> tuple[str, ...]:
    g, c, s = epochs
    return (
        f"method.falcon.generator_fit.epochs={g}",
        f"method.falcon.classifier_fit.epochs={c}",
        f"method.falcon.server_fit.epochs={s}",
    )


# ------------------------------------------------------------------------ FAFI
#: CIFAR-10's 50,000 training images, decoded with its 10,000 test images.
_CIFAR_TRAIN, _CIFAR_ALL = 50_000, 60_000
_FAFI_PAPER = {"fedavg": 17.43, "ensemble": 45.43, "fafi": 77.83}
_FAFI_NOTE = "FAFI Table 1, CIFAR-10, α 0.1 (5 clients, ResNet-18, 200 epochs)"
_FAFI_TINY = (
    "configs/fafi_cifar10_gpu.yaml",
    *_TINY_RUN,
    "sweep=[]",
    "model.name=cnn_small",
    "method.fafi.augment=none",
)


#: The clients' sizes in CIFAR-10's Dirichlet(0.1) split over 5 clients
#: (at least 10 images each) per seed: what ``osfl partition --dataset
#: imagefolder:cifar10 --scheme dirichlet --alpha 0.1 --clients 5
#: --min-partition-size 10 --seed S`` gives (the SALT parts' work).
_FAFI_SIZES = {
    0: (2083, 1561, 12961, 18441, 14954),
    1: (10599, 3817, 6155, 13487, 15942),
    2: (7250, 16606, 9446, 10781, 5917),
}
#: The steps the 200-epoch SALT clients of one seed train in (``train_clients``).
_SALT_PARTS = 2


def _salt_parts(seed: int) -> list[tuple[int, ...]]:
    """Seed ``seed``'s clients in :data:`_SALT_PARTS` parts of about equal
    work: the largest client first, each into the lightest part so far."""
    sizes = _FAFI_SIZES[seed]
    parts: list[list[int]] = [[] for _ in range(_SALT_PARTS)]
    for c in sorted(range(len(sizes)), key=lambda c: -sizes[c]):
        min(parts, key=lambda p: sum(sizes[i] for i in p)).append(c)
    return [tuple(sorted(p)) for p in parts]


def _fafi_work(epochs: int, views: int, images: int = _CIFAR_TRAIN, tests: int = 3) -> Work:
    """``views`` x ``epochs`` passes over ``images`` (by default the five
    clients' 50,000), ``tests`` passes over the 10,000 test images, and
    decoding CIFAR-10 once."""
    steps = views * epochs * images + FORWARD * tests * 10_000
    return Work({"resnet18_32": steps, "decode": _CIFAR_ALL}, fixed_s=15.0)


def _fafi_step(kind: str, seed: int, epochs: int = 200) -> Step:
    """FAFI Table 1 at α 0.1, one seed: ``ce`` (FedAvg and Ensemble, whose CE
    clients they share) or ``salt`` (FAFI's SALT clients, two views of every
    image); both read and fill the same client cache (``.osfl_cache``). The
    200-epoch SALT step finds its clients there: :func:`_salt_part` steps
    trained them (one command cannot)."""
    salt = kind == "salt"
    methods = "methods=[fafi]" if salt else "methods=[fedavg,ensemble]"
    short = "" if epochs == 200 else f"_e{epochs}"
    paper = (
        {"fafi": {50: 63.55, 100: 68.12, 200: 77.83}[epochs]}
        if salt
        else {m: _FAFI_PAPER[m] for m in ("fedavg", "ensemble")}
    )
    parts = salt and epochs == 200
    name = f"fafi_{kind}{short}_a0.1_seed{seed}"
    return Step(
        name=name,
        section="fafi",
        kind="run",
        argv=_osfl_run(*_fafi_argv(seed, methods, epochs)),
        tiny=_osfl_run(*_FAFI_TINY, f"seeds=[{seed}]", methods, *(_TINY_CACHE if parts else ())),
        # every client in the cache: the fusion's passes over the test set per client
        work=_fafi_work(0, 0, tests=10) if parts else _fafi_work(epochs, 2 if salt else 1),
        paper=paper,
        paper_note=_FAFI_NOTE
        if epochs == 200
        else f"FAFI Table 5, CIFAR-10, α 0.1, {epochs} local epochs (FAFI only)",
        scale_note=f"the paper's setting at {epochs} local epochs; one seed per step "
        "(the paper: 5 trials)"
        + (
            "; its clients trained by the steps before it, into the same client cache"
            if parts
            else ""
        ),
        needs=tuple(f"fafi_salt_part{i + 1}_a0.1_seed{seed}" for i in range(_SALT_PARTS))
        if parts
        else (),
        row=f"fafi_t1{short}_a0.1",
    )


#: The dry run's SALT parts and row share a client cache of their own.
_TINY_CACHE = ("cache_dir={out}/../.fafi_cache",)


def _fafi_argv(seed: int, methods: str, epochs: int = 200) -> tuple[str, ...]:
    return (
        "configs/fafi_cifar10_gpu.yaml",
        "partition.alpha=0.1",
        "sweep=[]",
        f"seeds=[{seed}]",
        methods,
        *(() if epochs == 200 else (f"train.epochs={epochs}",)),
    )


def _salt_part(seed: int, part: int) -> Step:
    """Part ``part`` (from 0) of seed ``seed``'s 200-epoch SALT clients:
    ``osfl run ... train_clients=[...]`` trains them into the client cache and
    stops (no accuracy, no row); ``fafi_salt_a0.1_seed{seed}`` makes the row."""
    clients = _salt_parts(seed)[part]
    ids = ",".join(map(str, clients))
    images = sum(_FAFI_SIZES[seed][c] for c in clients)
    return Step(
        name=f"fafi_salt_part{part + 1}_a0.1_seed{seed}",
        section="fafi",
        kind="run",
        argv=_osfl_run(*_fafi_argv(seed, "methods=[fafi]"), f"train_clients=[{ids}]"),
        # the dry run's two clients, one per part
        tiny=_osfl_run(
            *_FAFI_TINY,
            f"seeds=[{seed}]",
            "methods=[fafi]",
            *_TINY_CACHE,
            f"train_clients=[{part}]",
        ),
        work=_fafi_work(200, 2, images=images, tests=0),
        paper_note=_FAFI_NOTE,
        scale_note=f"FAFI's SALT clients {ids} of 5 ({images:,} images), 200 local epochs, "
        "into the client cache: no row of its own",
        row="fafi_t1_a0.1",
        feeds=f"fafi_salt_a0.1_seed{seed}",
    )


def _fafi_row(seed: int) -> tuple[Step, ...]:
    """Seed ``seed``'s FAFI Table 1 row at α 0.1: the CE clients, the SALT
    clients in parts, then the SALT step that finds them all cached."""
    parts = (_salt_part(seed, i) for i in range(_SALT_PARTS))
    return (_fafi_step("ce", seed), *parts, _fafi_step("salt", seed))


# ------------------------------------------------------------------------- RLU
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


def _rlu_step(which: str) -> Step:
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
            {"resnet18_32": VGG16_PER_R18 * vgg, "decode": _CIFAR_ALL},
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
_FROZEN_IMAGES = 7_500  # classes 5-9 at 1,000 / 500 per class (falcon_label_gpu.yaml)


def _pretrain_step() -> Step:
    return Step(
        name="pretrain_vits16",
        section="pretrain",
        kind="pretrain",
        argv=(
            "pretrain",
            "configs/pretrain_cifar5_gpu.yaml",
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
            f"model.kwargs={_TINY_KW}",
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
        # and upsampled (measured on an H200: 5.1 s per epoch, 53 s of set-up)
        work=Work(
            {
                "vits16_224": 60 * 25_000 + FORWARD * 30_000,
                "decode": _CIFAR5_224,
                "resize_224": _CIFAR5_224,
            },
            fixed_s=10.0,
        ),
        paper_note="no paper number: the encoder the frozen-encoder rows use",
        scale_note="ViT-S/16 at 224 px, supervised, CIFAR-10 classes 0-4 (25,000 images)",
    )


def _frozen_step(
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
        argv=_osfl_run(*_FROZEN_GPU, "partition.alpha=0.1", methods, *extra),
        tiny=_osfl_run(*_TINY_FROZEN, "partition.alpha=0.1", methods, *tiny_extra),
        work=work,
        needs=("pretrain_vits16",),
        paper=paper,
        paper_note="FALCON Table 2, Tiny-ImageNet, α 0.1 (DINOv2-B at 448 px); no CIFAR row",
        scale_note="substitutes: CIFAR-10 classes 5-9 at 448 px (1,000 / 500 per class) for "
        "Tiny-ImageNet, the suite's ViT-S/16 at 224-px views for DINOv2-B",
        row="falcon_t2_a0.1",
    )


_FROZEN_DATA = {"decode": _FROZEN_IMAGES, "resize_224": RESIZE_448 * _FROZEN_IMAGES}


def _fedmitr_step() -> Step:
    """FedMITR Table I at α 0.1: the clients fine-tune the suite's encoder
    (no ImageNet DeiT-Tiny travels) on CIFAR-10 classes 5-9 at 224 px for 10
    epochs, the server distils for 5 rounds of 100 inversion iterations of
    batch 64 through the 10 teachers and the student."""
    clients = 10 * 25_000
    inversion = 5 * 100 * 64 * 11  # rounds x iterations x batch x (teachers + student)
    return Step(
        name="fedmitr_t1_a0.1_seed0",
        section="fedmitr",
        kind="run",
        argv=_osfl_run(
            "configs/fedmitr_cifar10_gpu.yaml",
            DOWNSTREAM,
            DOWNSTREAM_DECODE,
            _VITS,
            "model.kwargs={pretrained: {encoder}}",
            "partition.alpha=0.1",
            "sweep=[]",
            "seeds=[0]",
            "methods=[fedavg,ensemble,adi,fedmitr]",
            "train.epochs=10",
            "method.fedmitr.epochs=5",
            "method.adi.epochs=5",
        ),
        tiny=_osfl_run(
            "configs/fedmitr_cifar10_gpu.yaml",
            *_TINY_RUN,
            "data.classes=[5,6,7,8,9]",
            *_TINY_VIT,
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
                "vits16_224": clients + 2 * inversion + 4 * FORWARD * 5_000,
                "decode": _CIFAR5_224,
                "resize_224": _CIFAR5_224,
            },
            fixed_s=20.0,
        ),
        needs=("pretrain_vits16",),
        paper={"fedavg": 24.30, "adi": 33.77, "fedmitr": 36.97},
        paper_note="FedMITR Table I, CIFAR-10, α 0.1 (10 clients, ImageNet DeiT-Tiny, 50 epochs)",
        scale_note="substitutes: the suite's ViT-S/16 (CIFAR-10 classes 0-4) for ImageNet "
        "DeiT-Tiny, classes 5-9; 10 local epochs, 5 server rounds (paper: 50, 20)",
        row="fedmitr_t1_a0.1",
    )


def _eftvit_step(method: str) -> Step:
    """EFTViT Table 1 at β 0.1, one method per step: 100 rounds (the
    paper's), 10 of 100 clients per round, 2 local epochs of their 250
    images, an evaluation of 5,000 test images every round."""
    rounds = 100
    per_round = 10 * 2 * 250 + FORWARD * 5_000
    return Step(
        name=f"eftvit_t1_b0.1_{method}",
        section="eftvit",
        kind="run",
        argv=_osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            DOWNSTREAM,
            DOWNSTREAM_DECODE,
            _VITS,
            "model.kwargs={pretrained: {encoder}}",
            "partition.alpha=0.1",
            "sweep=[]",
            f"methods=[{method}]",
            f"method.{method}.rounds={rounds}",
        ),
        tiny=_osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            *_TINY_RUN,
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
            {"vits16_224": rounds * per_round, "decode": _CIFAR5_224, "resize_224": _CIFAR5_224},
            fixed_s=15.0,
        ),
        needs=("pretrain_vits16",),
        paper={"fedhead": 92.27, "fedlora": 96.91, "eftvit": 98.12},
        paper_note="EFTViT Table 1, CIFAR-10, β 0.1 (ViT-B/16 ImageNet-21k, 100 rounds)",
        scale_note="substitutes: the suite's ViT-S/16 for ViT-B/16 ImageNet-21k (330 MiB, "
        "over the 64 MiB carried), CIFAR-10 classes 5-9; the paper's 100 rounds",
        row="eftvit_t1_b0.1",
    )


def _mfu_step() -> Step:
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
            "--out",
            "{out}",
        ),
        work=Work({"vits16_224": VITB_PER_VITS * 128 * 34}, fixed_s=10.0),
        tiny_work=Work({"vits16_224": 16.0}, fixed_s=1.0),
        paper={"mfu": 40.0},
        paper_note="the issue's target: at least 40 % of the GPU's dense bf16 peak",
        scale_note="ViT-B/16, 224 px, batch 128, bf16 autocast, forward + backward + AdamW",
    )


STEPS: tuple[Step, ...] = (
    _fafi_step("salt", 0, epochs=50),
    _fafi_step("salt", 0, epochs=100),
    *_fafi_row(0),
    _rlu_step("table2"),
    _rlu_step("fig1"),
    _pretrain_step(),
    _fedmitr_step(),
    _frozen_step(
        "frozen_closed_a0.1",
        "methods=[fedpft,fedcgs,ghofl]",
        {"fedpft": 59.40, "fedcgs": 81.53},
        # features of 7,500 images at 224-px views; closed-form heads and
        # FedPFT's mixtures (measured on an H200: 70 s, decoding included)
        Work({"vits16_224": FORWARD * _FROZEN_IMAGES, **_FROZEN_DATA}, fixed_s=30.0),
    ),
    _frozen_step(
        "falcon_a0.1",
        "methods=[falcon]",
        {"falcon": 79.93},
        # five views of every image (global + 2x2 regions), then the three fits
        Work(
            {"vits16_224": 5 * FORWARD * _FROZEN_IMAGES, **_FROZEN_DATA},
            fixed_s=180.0,
            note="the three fits (generator, classifiers, server): guessed, not measured",
        ),
        tiny_extra=(
            "method.falcon.views={input_size: 8, window: 4, stride: 4}",
            "method.falcon.generator_model={depth: 1, heads: 2, components: 2}",
            *_falcon_fit((2, 2, 2)),
        ),
    ),
    *(_eftvit_step(m) for m in ("fedhead", "fedlora", "eftvit")),
    _mfu_step(),
    *(step for seed in (1, 2) for step in _fafi_row(seed)),
)

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in STEPS))
