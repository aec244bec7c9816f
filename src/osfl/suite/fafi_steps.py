"""The GPU suite's FAFI steps (FAFI Table 1 at α 0.1 and its Table 5 epoch
counts; Zeng et al., ICML 2025, docs/methods/fafi.md): the CE clients' and
the SALT clients' training as separate steps that share the client cache;
the 200-epoch SALT clients in a ``train_clients`` part, then the row's step,
which trains the clients the part left (a share a lease's short later
command holds), finds the part's in the cache, fuses and tests (issue #50:
one step fewer, so one fixed cost fewer, than two parts and a fusion step).
"""

from __future__ import annotations

import itertools

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
#: The row step's share of a seed's SALT images: the later command of a
#: lease holds about 29 % of its step time (:mod:`osfl.suite.lease`: 162 of
#: 396 + 162 s), less the step's own fixed costs.
_ROW_SHARE = 0.27


def _salt_split(seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Seed ``seed``'s SALT clients as (the part's, the row step's): the row
    step trains the largest set of clients holding at most :data:`_ROW_SHARE`
    of the images (so that it fits a lease's later command where the part
    fits the first), the part the others."""
    sizes = _FAFI_SIZES[seed]
    limit = _ROW_SHARE * sum(sizes)
    subsets = (
        c for k in range(1, len(sizes)) for c in itertools.combinations(range(len(sizes)), k)
    )
    row = max(
        (c for c in subsets if sum(sizes[i] for i in c) <= limit),
        key=lambda c: (sum(sizes[i] for i in c), [-i for i in c]),
    )
    return tuple(i for i in range(len(sizes)) if i not in row), tuple(row)


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
    200-epoch SALT step finds the clients :func:`_salt_part` trained there
    and trains the others (:func:`_salt_split`)."""
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
    if parts:  # the clients the part left, then every client's fusion over the test set
        rest = sum(_FAFI_SIZES[seed][c] for c in _salt_split(seed)[1])
        work = _fafi_work(200, 2, images=rest, tests=10)
    else:
        work = _fafi_work(epochs, 2 if salt else 1)
    return Step(
        name=name,
        section="fafi",
        kind="run",
        argv=osfl_run(*_fafi_argv(seed, methods, epochs)),
        tiny=osfl_run(*_FAFI_TINY, f"seeds=[{seed}]", methods, *(_TINY_CACHE if parts else ())),
        work=work,
        paper=paper,
        paper_note=_FAFI_NOTE
        if epochs == 200
        else f"FAFI Table 5, CIFAR-10, α 0.1, {epochs} local epochs (FAFI only)",
        scale_note=f"the paper's setting at {epochs} local epochs; one seed per step "
        "(the paper: 5 trials)"
        + (
            f"; SALT clients {_ids(_salt_split(seed)[0])} trained by the step before it, "
            f"into the same client cache, clients {_ids(_salt_split(seed)[1])} by this one"
            if parts
            else ""
        ),
        needs=(f"fafi_salt_part1_a0.1_seed{seed}",) if parts else (),
        row=f"fafi_t1{short}_a0.1",
    )


def _ids(clients: tuple[int, ...]) -> str:
    return ", ".join(map(str, clients))


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


def _salt_part(seed: int) -> Step:
    """The part of seed ``seed``'s 200-epoch SALT clients trained before the
    row's step (:func:`_salt_split`): ``osfl run ... train_clients=[...]``
    trains them into the client cache and stops (no accuracy, no row);
    ``fafi_salt_a0.1_seed{seed}`` trains the rest and makes the row. The
    planner places the two in one lease or neither (:mod:`osfl.suite.plan`)."""
    clients = _salt_split(seed)[0]
    ids = ",".join(map(str, clients))
    images = sum(_FAFI_SIZES[seed][c] for c in clients)
    return Step(
        name=f"fafi_salt_part1_a0.1_seed{seed}",
        section="fafi",
        kind="run",
        argv=osfl_run(*_fafi_argv(seed, "methods=[fafi]"), f"train_clients=[{ids}]"),
        # the dry run's first client (of two) here, the other in the row's step
        tiny=osfl_run(
            *_FAFI_TINY,
            f"seeds=[{seed}]",
            "methods=[fafi]",
            *_TINY_CACHE,
            "train_clients=[0]",
        ),
        work=_fafi_work(200, 2, images=images, tests=0),
        paper_note=_FAFI_NOTE,
        scale_note=f"FAFI's SALT clients {_ids(clients)} of 5 ({images:,} images), 200 local "
        "epochs, into the client cache: no row of its own",
        row="fafi_t1_a0.1",
        feeds=f"fafi_salt_a0.1_seed{seed}",
    )


def fafi_row(seed: int) -> tuple[Step, ...]:
    """Seed ``seed``'s FAFI Table 1 row at α 0.1: the CE clients, a part of
    the SALT clients, then the SALT step that trains the rest and fuses."""
    return (fafi_step("ce", seed), _salt_part(seed), fafi_step("salt", seed))
