"""The GPU suite's FAFI steps (FAFI Table 1 at α 0.1 and its Table 5 epoch
counts; Zeng et al., ICML 2025, docs/methods/fafi.md): the CE clients' and
the SALT clients' training as separate steps that share the client cache, the
200-epoch SALT clients in ``train_clients`` parts before the step that finds
them all cached.
"""

from __future__ import annotations

from osfl.suite.step_parts import CIFAR_ALL, TINY_RUN, osfl_run
from osfl.suite.steps import FORWARD, Step, Work

#: CIFAR-10's 50,000 training images, decoded with its 10,000 test images.
_CIFAR_TRAIN = 50_000
_FAFI_PAPER = {"fedavg": 17.43, "ensemble": 45.43, "fafi": 77.83}
_FAFI_NOTE = "FAFI Table 1, CIFAR-10, α 0.1 (5 clients, ResNet-18, 200 epochs)"
_FAFI_TINY = (
    "configs/fafi_cifar10_gpu.yaml",
    *TINY_RUN,
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
    return Work({"resnet18_32": steps, "decode": CIFAR_ALL}, fixed_s=15.0)


def fafi_step(kind: str, seed: int, epochs: int = 200) -> Step:
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
        argv=osfl_run(*_fafi_argv(seed, methods, epochs)),
        tiny=osfl_run(*_FAFI_TINY, f"seeds=[{seed}]", methods, *(_TINY_CACHE if parts else ())),
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
        argv=osfl_run(*_fafi_argv(seed, "methods=[fafi]"), f"train_clients=[{ids}]"),
        # the dry run's two clients, one per part
        tiny=osfl_run(
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


def fafi_row(seed: int) -> tuple[Step, ...]:
    """Seed ``seed``'s FAFI Table 1 row at α 0.1: the CE clients, the SALT
    clients in parts, then the SALT step that finds them all cached."""
    parts = (_salt_part(seed, i) for i in range(_SALT_PARTS))
    return (fafi_step("ce", seed), *parts, fafi_step("salt", seed))
