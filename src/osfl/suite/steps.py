"""A step of the GPU suite and what it computes (issues #32, #40).

A :class:`Step` is one command (``osfl pretrain`` / ``osfl run`` / the MFU
benchmark / a benchmark script) that writes one directory, with its
:class:`Work`: how many image-steps of which model, how many images decoded
and resized, plus a fixed cost of its own. A job first measures this
machine's rates (:mod:`osfl.suite.rates`); a step's estimate is then its
work over those rates plus the measured start-up, times :data:`MARGIN`.
Here too: the paths and overrides every catalogue step shares
(:data:`ENCODER`, :data:`DOWNSTREAM`, ...) and the per-model constants the
catalogue's work is priced in (:mod:`osfl.suite.catalogue` lists the steps).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError

#: The encoder step's output, relative to the suite's directory
#: (``{encoder}`` in a command).
ENCODER = "pretrained/cifar5_vits16_sup.safetensors"
#: The five downstream classes, disjoint from the encoder's upstream ones.
DOWNSTREAM = "data.classes=[dog,frog,horse,ship,truck]"
#: ... decoded alone from the pack (the image folder's ``classes`` option: the
#: same samples as a full load restricted by ``data.classes``, a half of the
#: decoding); the tiny forms' digits decode in milliseconds and take no such option.
DOWNSTREAM_DECODE = "data.options.classes=[dog,frog,horse,ship,truck]"
#: The encoder's upstream classes 0-4 (``upstream.classes`` of
#: configs/pretrain_cifar5_gpu.yaml), decoded alone in the same way.
UPSTREAM_DECODE = "upstream.options.classes=[0,1,2,3,4]"

#: Head-room on an estimate: the rates are a micro-benchmark's, the training
#: loop adds augmentation, evaluation and logging.
MARGIN = 1.2
#: The longest step a plan runs: one command of a lease is at most 10
#: minutes, of which the job keeps one for the bundle and one for the rates.
STEP_CAP_S = 8 * 60.0
#: FLOPs of a training step per image against the measured models': VGG-16
#: (CIFAR, 0.31 GFLOPs) and ViT-B/16 (17.6) against the CIFAR ResNet-18
#: (0.56) and ViT-S/16 (4.6); an upsampling to 448 px against one to 224.
VGG16_PER_R18 = 0.55
VITB_PER_VITS = 3.8
RESIZE_448 = 4.0
#: A forward pass (evaluation, feature extraction) against a training step.
FORWARD = 1.0 / 3.0


@dataclass(frozen=True)
class Work:
    """What a step computes, in the units of :data:`osfl.suite.rates.RATE_KEYS`
    (image-steps of a model, images decoded or resized), plus ``fixed_s``:
    seconds of its own no rate prices (closed-form fits, attacks' Monte
    Carlo), stated where guessed in ``note``."""

    units: Mapping[str, float] = field(default_factory=dict)
    fixed_s: float = 0.0
    note: str = ""

    def seconds(self, rates: Mapping[str, Any], margin: float = MARGIN) -> float:
        """``(sum of units / rate + fixed_s) x margin + rates["startup_s"]``."""
        missing = sorted(k for k in self.units if k not in rates)
        if missing:
            raise ConfigError(f"no measured rate for {', '.join(missing)}")
        busy = sum(n / float(rates[k]) for k, n in self.units.items()) + self.fixed_s
        return busy * margin + float(rates.get("startup_s", 0.0))


#: A tiny command's work: a handful of toy steps (the dry run's plan).
TINY_WORK = Work({"resnet18_32": 400.0, "decode": 200.0}, fixed_s=2.0)


@dataclass(frozen=True)
class Step:
    """One command of the suite and what its finished directory reports.

    ``argv``: the command (without ``osfl``) at paper scale, with ``{out}``
    (the step's directory) and ``{encoder}`` placeholders (a ``script``
    step's ``argv`` starts with ``script``, then the script's path and
    arguments); ``work``: what it computes (its estimate's source);
    ``tiny``/``tiny_work``: the dry run's; ``paper``: method -> the paper's
    number (%), ``paper_note`` what that number is of; ``needs``: steps
    whose output this one reads; ``row``: the headline row its rows belong
    to (steps of one row, e.g. FAFI's CE and SALT clients or several seeds,
    share it); ``scale_note``: the scale, and any substitute (encoder, data);
    ``feeds``: the step that makes the row from this one's output when this
    one trains only some clients into the shared client cache
    (``train_clients``): it has no rows of its own, and is not run again
    once that step's rows are in the repository.
    """

    name: str
    section: str
    kind: str  # "pretrain" | "run" | "mfu" | "script"
    argv: tuple[str, ...]
    tiny: tuple[str, ...]
    work: Work = field(default_factory=Work)
    tiny_work: Work = TINY_WORK
    paper: Mapping[str, float] = field(default_factory=dict)
    paper_note: str = ""
    needs: tuple[str, ...] = ()
    scale_note: str = ""
    row: str = ""
    feeds: str = ""

    @property
    def headline(self) -> str:
        """The headline row's name (the step's own when ``row`` is empty)."""
        return self.row or self.name

    def command(self, *, dry_run: bool) -> tuple[str, ...]:
        return self.tiny if dry_run else self.argv

    def estimate(self, rates: Mapping[str, Any], *, dry_run: bool) -> float:
        """Seconds this step's command should take at ``rates``."""
        return (self.tiny_work if dry_run else self.work).seconds(rates)


def command_text(argv: Sequence[str]) -> str:
    """The command a person types: ``osfl ...``, or ``python SCRIPT ...``."""
    if argv and argv[0] == "script":
        return "python " + shlex.join(argv[1:])
    return "osfl " + shlex.join(argv)
