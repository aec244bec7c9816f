"""The paper-scale runs a lent GPU should make, in order of value, and the
plan of those that fit a budget (issue #32).

A :class:`Step` is one osfl command (``osfl pretrain`` / ``osfl run`` / the
MFU benchmark) that writes one directory, with the short command that
calibrates its cost: the same command with fewer epochs and images, whose
measured seconds times the step's ``ratio`` (the full command's work over the
calibration's, by construction of the two) is the step's estimate. Fixed
costs (loading data, building the model, the first CUDA kernels) are scaled
with the rest, so an estimate errs long, never short.

``STEPS`` is the catalogue in the issue's order of value: a stronger encoder
first (every frozen-encoder row below needs it), the frozen-encoder methods
on it at 224-px views (the closed-form heads before FALCON, which costs two
orders of magnitude more), FAFI Table 1 at α 0.1 one seed per step, the MFU
benchmark, EFTViT Table 1. Each step has a ``tiny`` form on 8-px digits
that ``--dry-run`` runs on a CPU through the very same code path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError

#: The encoder step's output, relative to the suite's directory
#: (``{encoder}`` in a command: the calibration's own file while calibrating).
ENCODER = "pretrained/cifar5_vits16_sup.safetensors"
#: The five downstream classes, disjoint from the encoder's upstream ones.
DOWNSTREAM = "data.classes=[dog,frog,horse,ship,truck]"
_VITS = "model.name=vit_small_patch16_224"
_FROZEN_GPU = (
    "configs/falcon_label_gpu.yaml",
    DOWNSTREAM,
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


@dataclass(frozen=True)
class Step:
    """One command of the suite and what its finished directory reports.

    ``argv``: the osfl command (without ``osfl``) at paper scale, with
    ``{out}`` (the step's directory) and ``{encoder}`` placeholders;
    ``calibrate``: overrides added for the calibration run; ``ratio``:
    the full command's work over the calibration's (``tiny_calibrate`` and
    ``tiny_ratio``: the same for the dry run); ``paper``: method ->
    the paper's number (%), ``paper_note`` what that number is of; ``needs``:
    steps whose output this one reads; ``tiny``: the dry run's command.
    """

    name: str
    section: str
    kind: str  # "pretrain" | "run" | "mfu"
    argv: tuple[str, ...]
    calibrate: tuple[str, ...]
    ratio: float
    tiny: tuple[str, ...]
    tiny_calibrate: tuple[str, ...] = ()
    tiny_ratio: float = 1.0
    paper: Mapping[str, float] = field(default_factory=dict)
    paper_note: str = ""
    needs: tuple[str, ...] = ()
    scale_note: str = ""
    #: GPU name -> seconds the full command took on a lent machine of that
    #: name (measured, or extrapolated from measured runs, as ``measured_note``
    #: says): used instead of a calibration there.
    measured_s: Mapping[str, float] = field(default_factory=dict)
    measured_note: str = ""

    def command(self, *, dry_run: bool) -> tuple[str, ...]:
        return self.tiny if dry_run else self.argv

    def calibration(self, *, dry_run: bool) -> tuple[str, ...]:
        return self.tiny_calibrate if dry_run else self.calibrate

    def work_ratio(self, *, dry_run: bool) -> float:
        return self.tiny_ratio if dry_run else self.ratio

    def measured(self, machine: str | None) -> float | None:
        """Seconds this step's full command took on ``machine`` (a GPU name),
        with :data:`MEASURED_MARGIN`; ``None`` where it was not measured."""
        seconds = self.measured_s.get(machine or "")
        return None if seconds is None else MEASURED_MARGIN * seconds


#: Head-room on a step's cost measured on the same kind of machine (run-to-run
#: spread, a cold data cache).
MEASURED_MARGIN = 1.15


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


def _fafi_seed(seed: int) -> Step:
    return Step(
        name=f"fafi_a0.1_seed{seed}",
        section="fafi",
        kind="run",
        argv=_osfl_run(
            "configs/fafi_cifar10_gpu.yaml",
            "partition.alpha=0.1",
            "sweep=[]",
            f"seeds=[{seed}]",
        ),
        # 200 local epochs on all images -> 4 epochs on a fifth of them (x250)
        calibrate=(
            "train.epochs=4",
            "data.max_per_class=1000",
            "data.options={test_max_per_class: 200}",
        ),
        ratio=250.0,
        tiny=_osfl_run(
            "configs/fafi_cifar10_gpu.yaml",
            *_TINY_RUN,
            "seeds=[0]",
            "sweep=[]",
            "model.name=cnn_small",
            "method.fafi.augment=none",
        ),
        tiny_calibrate=("partition.num_clients=2",),
        paper={"fedavg": 17.43, "ensemble": 45.43, "fafi": 77.83},
        paper_note="FAFI Table 1, CIFAR-10, α 0.1 (5 clients, ResNet-18, 200 epochs)",
        scale_note="the paper's setting; one seed per step (the paper: 5 trials)",
    )


STEPS: tuple[Step, ...] = (
    Step(
        name="pretrain_vits16",
        section="pretrain",
        kind="pretrain",
        argv=(
            "pretrain",
            "configs/pretrain_cifar5_gpu.yaml",
            "--out",
            f"{{out}}/{ENCODER}",
            "--force",
            "--no-progress",
        ),
        # 60 epochs of 25,000 images -> 1 epoch of 2,500 (x600)
        calibrate=("train.epochs=1", "upstream.max_per_class=500", "probe_max_per_class=50"),
        ratio=600.0,
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
        paper_note="no paper number: the encoder the frozen-encoder rows use",
        scale_note="ViT-S/16 at 224 px, supervised, CIFAR-10 classes 0-4 (25,000 images)",
        # 53 s of decoding, upsampling and set-up + 60 x 5.1 s per epoch (a 9- and a
        # 30-epoch run: 5.6 and 5.1 s per epoch)
        measured_s={"NVIDIA H200": 360.0},
        measured_note="extrapolated from 9- and 30-epoch runs on an H200, 2026-11-25",
    ),
    Step(
        name="frozen_closed_a0.1",
        section="frozen",
        kind="run",
        argv=_osfl_run(
            *_FROZEN_GPU,
            "partition.alpha=0.1",
            "methods=[fedpft,fedcgs,ghofl]",
        ),
        calibrate=("data.max_per_class=100", "data.options={test_max_per_class: 50}"),
        ratio=10.0,
        tiny=_osfl_run(
            *_TINY_FROZEN,
            "partition.alpha=0.1",
            "methods=[fedpft,fedcgs,ghofl]",
        ),
        needs=("pretrain_vits16",),
        paper={"fedcgs": 81.53},
        paper_note="FALCON Table 2, Tiny-ImageNet, α 0.1 (DINOv2-B at 448 px); no CIFAR row",
        scale_note="CIFAR-10 classes 5-9 at 448 px (1,000 / 500 per class), ViT-S/16 at 224-px views",
        measured_s={"NVIDIA H200": 70.0},
        measured_note="measured on an H200, 2026-11-25 (decoding 15,000 images included)",
    ),
    Step(
        name="falcon_a0.1",
        section="frozen",
        kind="run",
        argv=_osfl_run(
            *_FROZEN_GPU,
            "partition.alpha=0.1",
            "methods=[falcon]",
        ),
        # a tenth of the images and of every fit's epochs (x100)
        calibrate=(
            "data.max_per_class=100",
            "data.options={test_max_per_class: 50}",
            *_falcon_fit((40, 6, 6)),
        ),
        ratio=100.0,
        tiny=_osfl_run(
            *_TINY_FROZEN,
            "partition.alpha=0.1",
            "methods=[falcon]",
            "method.falcon.views={input_size: 8, window: 4, stride: 4}",
            "method.falcon.generator_model={depth: 1, heads: 2, components: 2}",
            *_falcon_fit((2, 2, 2)),
        ),
        needs=("pretrain_vits16",),
        paper={"falcon": 79.93},
        paper_note="FALCON Table 2, Tiny-ImageNet, α 0.1 (DINOv2-B at 448 px); no CIFAR row",
        scale_note="CIFAR-10 classes 5-9 at 448 px, ViT-S/16 at 224-px views (a global view + 2x2 regions)",
    ),
    *(_fafi_seed(s) for s in range(5)),
    Step(
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
        calibrate=("--steps", "3"),
        ratio=10.0,
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
        paper={"mfu": 40.0},
        paper_note="the issue's target: at least 40 % of the GPU's dense bf16 peak",
        scale_note="ViT-B/16, 224 px, batch 128, bf16 autocast, forward + backward + AdamW",
        measured_s={"NVIDIA H200": 15.0},
        measured_note="measured on an H200, 2026-11-25",
    ),
    Step(
        name="eftvit_t1_b0.1",
        section="eftvit",
        kind="run",
        argv=_osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            DOWNSTREAM,
            _VITS,
            "model.kwargs={pretrained: {encoder}}",
            "partition.alpha=0.1",
            "sweep=[]",
            "methods=[fedhead,fedlora,eftvit]",
            "method.fedhead.rounds=30",
            "method.fedlora.rounds=30",
            "method.eftvit.rounds=30",
        ),
        calibrate=("method.fedhead.rounds=3", "method.fedlora.rounds=3", "method.eftvit.rounds=3"),
        ratio=10.0,
        tiny=_osfl_run(
            "configs/eftvit_cifar10_gpu.yaml",
            *_TINY_RUN,
            "data.classes=[5,6,7,8,9]",
            "model.name=vit_tiny_patch2_16",
            "model.kwargs={pretrained: {encoder}, img_size: 8, patch_size: 2, depth: 2, embed_dim: 32, num_heads: 2, in_chans: 1}",
            "partition.alpha=0.1",
            "sweep=[]",
            "methods=[fedhead,eftvit]",
            "method.fedhead.rounds=2",
            "method.fedhead.client_fraction=1.0",
            "method.eftvit.rounds=2",
            "method.eftvit.client_fraction=1.0",
            "method.eftvit.local_depth=1",
            "transform.train=none",
        ),
        needs=("pretrain_vits16",),
        paper={"fedhead": 92.27, "fedlora": 96.91, "eftvit": 98.12},
        paper_note="EFTViT Table 1, CIFAR-10, β 0.1 (ViT-B/16 ImageNet-21k, 100 rounds)",
        scale_note=(
            "the suite's ViT-S/16 (ImageNet-21k weights do not fit the 64 MiB carried), "
            "CIFAR-10 classes 5-9, 30 rounds"
        ),
    ),
)

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in STEPS))


def select_steps(sections: Sequence[str], steps: Sequence[Step] = STEPS) -> list[Step]:
    """The catalogue's steps of ``sections`` (every section when empty) and
    the steps they need (the encoder), in the catalogue's order of value."""
    unknown = sorted(set(sections) - {s.section for s in steps})
    if unknown:
        raise ConfigError(
            f"unknown suite section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}"
        )
    chosen = {s.name for s in steps if not sections or s.section in sections}
    chosen |= {n for s in steps if s.name in chosen for n in s.needs}
    return [s for s in steps if s.name in chosen]


@dataclass
class Planned:
    """One step's place in the plan: its estimate, and what became of it."""

    step: Step
    calibration_s: float | None = None
    estimate_s: float | None = None
    estimate_from: str = ""  # "calibration", or the measurement it came from
    status: str = "pending"  # pending | planned | skipped | done | failed
    reason: str = ""
    seconds: float | None = None
    out: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["step"] = {"name": self.step.name, "section": self.step.section, "kind": self.step.kind}
        return d


def make_plan(planned: Sequence[Planned], budget_s: float) -> list[Planned]:
    """Mark, in order of value, the calibrated steps whose estimates fit what
    is left of ``budget_s`` as ``planned``; the others ``skipped`` with why
    (a later, cheaper step may still fit where an earlier one did not). A
    step whose ``needs`` are not planned is skipped too."""
    left = budget_s
    chosen = {p.step.name for p in planned if p.status == "done"}
    for p in planned:
        if p.status != "pending":
            continue
        missing = [n for n in p.step.needs if n not in chosen]
        if missing:
            p.status, p.reason = "skipped", f"needs {', '.join(missing)}, not planned"
        elif p.estimate_s is None:
            p.status, p.reason = "skipped", "no estimate"
        elif p.estimate_s > left:
            p.status = "skipped"
            p.reason = f"estimate {p.estimate_s:.0f} s > {left:.0f} s left of the budget"
        else:
            p.status = "planned"
            left -= p.estimate_s
            chosen.add(p.step.name)
    return list(planned)
