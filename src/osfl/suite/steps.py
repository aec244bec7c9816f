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

#: The encoder step's output, relative to its step directory (``{encoder}``
#: in a command, unless the repository holds a committed copy:
#: :mod:`osfl.suite.encoder`): a ViT-Ti/16, small enough in bf16 (11 MiB) to
#: come back in a bundle and to travel with the repository.
ENCODER = "pretrained/cifar5_vitti16_sup.safetensors"
#: The step that trains it.
ENCODER_STEP = "pretrain_vitti16"
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
#: FLOPs of a training step per image against the measured models': VGG-16
#: (CIFAR, 0.31 GFLOPs) and ViT-B/16 (17.6) against the CIFAR ResNet-18
#: (0.56) and ViT-S/16 (4.6); an upsampling to 448 px against one to 224.
VGG16_PER_R18 = 0.55
VITB_PER_VITS = 3.8
RESIZE_448 = 4.0
#: A ViT-Ti/16 step against a ViT-S/16 one where a job has not measured the
#: ViT-Ti rate itself (``vitti16_224``, :mod:`osfl.suite.rates`, measures it):
#: FLOPs say 0.27 (1.26 against 4.6 GFLOPs), but its 192-wide matrices fill a
#: large GPU less; 0.45 errs long until a lease measures it.
VITT_PER_VITS = 0.45
#: Rates a job may lack (an older ``rates.json``), derived from a measured
#: one: key -> (measured key, that key's image-steps per one of this key's).
DERIVED_RATES = {"vitti16_224": ("vits16_224", VITT_PER_VITS)}


def rate_of(rates: Mapping[str, Any], key: str) -> float:
    """The rate ``key`` (images per second): measured, else derived
    (:data:`DERIVED_RATES`); a :class:`ConfigError` when neither."""
    if key in rates:
        return float(rates[key])
    if key in DERIVED_RATES and DERIVED_RATES[key][0] in rates:
        base, per = DERIVED_RATES[key]
        return float(rates[base]) / per
    raise ConfigError(f"no measured rate for {key}")


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

    def busy(self, rates: Mapping[str, Any]) -> dict[str, float]:
        """Seconds of each unit at ``rates`` (no margin, no start-up)."""
        missing = []
        for k in self.units:
            try:
                rate_of(rates, k)
            except ConfigError:
                missing.append(k)
        if missing:
            raise ConfigError(f"no measured rate for {', '.join(sorted(missing))}")
        return {k: n / rate_of(rates, k) for k, n in self.units.items()}

    def seconds(self, rates: Mapping[str, Any], margin: float = MARGIN) -> float:
        """``(sum of units / rate + fixed_s) x margin + rates["startup_s"]``."""
        busy = sum(self.busy(rates).values()) + self.fixed_s
        return busy * margin + float(rates.get("startup_s", 0.0))

    def kind(self, rates: Mapping[str, Any]) -> str:
        """The kind of work: the unit that takes the most of its time at
        ``rates`` (``fixed`` when its own fixed cost does); what a learned
        scale factor (:mod:`osfl.suite.learn`) is shared by."""
        busy = {**self.busy(rates), "fixed": self.fixed_s}
        return max(busy, key=lambda k: busy[k])


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
    (``train_clients``): it has no rows of its own, is not run again once
    that step's rows are in the repository, and is planned only with that
    step in the same lease (:func:`osfl.suite.plan.make_plan`);
    ``backbone``: what the rows' encoder is when it is not the paper's (a
    self-pretrained one), shown beside every row; ``returns``: files of the
    step's directory that come back in the bundle as they are (the
    encoder's weights and card, each at most 16 MiB); ``post``: what runs on
    the finished directory before its outputs are hashed
    (:data:`osfl.suite.encoder.POSTPROCESS`).
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
    backbone: str = ""
    returns: tuple[str, ...] = ()
    post: str = ""

    @property
    def headline(self) -> str:
        """The headline row's name (the step's own when ``row`` is empty)."""
        return self.row or self.name

    def command(self, *, dry_run: bool) -> tuple[str, ...]:
        return self.tiny if dry_run else self.argv

    def work_for(self, *, dry_run: bool) -> Work:
        return self.tiny_work if dry_run else self.work

    def estimate(self, rates: Mapping[str, Any], *, dry_run: bool) -> float:
        """Seconds this step's command should take at ``rates`` (before any
        learned scale factor: :class:`osfl.suite.pricing.Pricing`)."""
        return self.work_for(dry_run=dry_run).seconds(rates)


def command_text(argv: Sequence[str]) -> str:
    """The command a person types: ``osfl ...``, or ``python SCRIPT ...``."""
    if argv and argv[0] == "script":
        return "python " + shlex.join(argv[1:])
    return "osfl " + shlex.join(argv)
