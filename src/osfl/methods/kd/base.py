"""The common skeleton of the data-free distillation methods.

Client side: exactly one-shot FedAvg's / Ensemble's (:class:`ClientModelsMethod`:
broadcast the common initial weights, each client uploads its model trained
through the shared client cache), so a comparison of FedAvg, Ensemble, FedDF,
DENSE, Co-Boosting, DeepInversion, FedFTG and FedMITR trains every client once
(docs/design.md §2).

Server side (:meth:`DistillationMethod.aggregate`): keep the client models,
build the ensemble teacher (:class:`~osfl.methods.kd.teacher.EnsembleTeacher`)
and the server model (the FedAvg of the clients, or the common random
initialisation: ``init``), then run the method's own
:meth:`~DistillationMethod.server_train` — synthesis + distillation — timed
per phase (``synthesis`` / ``distillation``, with FLOPs from
``torch.utils.flop_counter`` when ``count_flops``). The predictor is the
distilled server model alone (one forward per image, unlike the Ensemble).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from osfl.data.transforms import Transform
from osfl.errors import ConfigError
from osfl.fl.context import RunContext
from osfl.fl.method import Artifacts, ImprovesOn, Predictor, Reporting, SiteEvaluation
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload
from osfl.methods.clients import (
    WEIGHTINGS,
    ClientModelsMethod,
    ModelPredictor,
    average_states,
    cpu_state,
    model_from_state,
    public_fl_hparams,
)
from osfl.methods.kd.augment import AUGMENTS, build_augment
from osfl.methods.kd.distill import DistillConfig, Distiller, LossFn
from osfl.methods.kd.pool import SyntheticPool
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher

__all__ = ["INITS", "DistillationMethod", "KDConfig", "PhaseTimer", "ServerSide"]

log = logging.getLogger(__name__)

#: How the server model starts: the clients' FedAvg, or the run's common random init.
INITS = ("fedavg", "scratch")


@dataclass(frozen=True)
class KDConfig:
    """Options every data-free distillation method shares.

    Server model: ``init`` (``fedavg`` | ``scratch``). Teacher: ``weighting``
    (``uniform`` | ``data_size``). The server runs ``epochs`` rounds of
    synthesis (``synthesis_batch_size`` images per batch) then distillation
    (``distill``: :class:`~osfl.methods.kd.distill.DistillConfig`, the
    optimizer and the KD loss, set as ``method.<name>.distill.lr=...``), pool
    images augmented by ``augment`` (none | flip | crop_flip), the pool capped
    at ``pool_size`` (null = unbounded). ``count_flops`` counts FLOPs per phase
    (slower). The defaults are FedMITR's Appendix A server recipe; each method
    overrides them with its own paper's or code's.
    """

    #: where the server model starts: fedavg (the clients' average) or scratch
    init: str = "fedavg"
    #: weights of the client ensemble (the teacher): uniform or data_size
    weighting: str = "uniform"
    #: server rounds of synthesis then distillation
    epochs: int = 20
    #: images synthesised per batch
    synthesis_batch_size: int = 64
    #: augmentation of pool images while distilling: none, flip or crop_flip
    augment: str = "none"
    #: cap on the synthetic pool, oldest first out (null: keep all)
    pool_size: int | None = None
    #: count FLOPs per server phase into the record (slower)
    count_flops: bool = False
    #: the server's distillation optimiser and loss
    distill: DistillConfig = field(default_factory=DistillConfig)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"method options: {msg}")

        need(self.init in INITS, f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.synthesis_batch_size >= 1, "synthesis_batch_size must be >= 1")
        need(
            self.pool_size is None or self.pool_size >= 1,
            f"pool_size must be >= 1 or null, got {self.pool_size}",
        )
        WEIGHTINGS.get(self.weighting)
        AUGMENTS.get(self.augment)


class PhaseTimer:
    """Wall time (and optionally FLOPs) of named server phases, summed over calls."""

    def __init__(self, count_flops: bool = False):
        self.count_flops = count_flops
        self.seconds: dict[str, float] = {}
        self.flops: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        counter: Any = nullcontext()
        if self.count_flops:
            counter = FlopCounterMode(display=False)
        start = time.perf_counter()
        with counter:
            yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        if self.count_flops:
            self.flops[name] = self.flops.get(name, 0) + int(counter.get_total_flops())

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"seconds": {k: round(v, 4) for k, v in self.seconds.items()}}
        if self.count_flops:
            d["flops"] = dict(self.flops)
        return d


@dataclass
class ServerSide:
    """What a method's server-side training needs besides teacher and student."""

    run: RunContext
    device: torch.device
    generator: torch.Generator  # CPU generator seeded from the run seed and method name
    space: InputSpace
    client_ids: list[int]
    num_samples: list[int]
    timer: PhaseTimer
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)  # each upload's meta
    # tensors worth keeping after the run (e.g. the synthetic pool), see Method.artifacts
    artifacts: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.run.image_shape
        return (c, h, w)

    @property
    def num_classes(self) -> int:
        return self.run.num_classes

    def seed(self, *parts: object) -> int:
        return derive_seed(self.run.seed, "kd-server", *parts)


def seeded(seed: int) -> Any:
    """Fork the global torch RNG under ``seed`` (module initialisation draws from it)."""

    @contextmanager
    def ctx() -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield

    return ctx()


#: The smoke task of the server-side methods: a non-IID split where FedAvg is
#: weak and the ensemble strong, so that distillation has something to gain.
WEAK_FEDAVG_TASK = ("data.max_per_class=60", "partition.alpha=0.1")


class DistillationMethod(ClientModelsMethod, SiteEvaluation, ImprovesOn, Reporting, Artifacts):
    """One-shot; server = synthesis + distillation into one model.

    Subclasses set ``Config`` (a :class:`KDConfig` subclass) and implement
    :meth:`server_train`. State: ClientModelsMethod's plus ``server`` (the
    distilled state dict) and ``phases`` (seconds/FLOPs per phase).
    """

    Config: ClassVar[type] = KDConfig

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        state = super().aggregate(state, uploads, round)
        ids, models = self.client_models(state)
        device = self.run.device
        for m in models:
            m.to(device).eval()
        side = ServerSide(
            run=self.run,
            device=device,
            generator=torch.Generator().manual_seed(
                derive_seed(self.run.seed, self.name, "server")
            ),
            space=InputSpace.from_transform(self.run.eval_transform, self.run.image_shape[0]),
            client_ids=ids,
            num_samples=[int(state["num_samples"][c]) for c in ids],
            timer=PhaseTimer(bool(self.config.count_flops)),
            meta={c: dict(uploads[c].meta) for c in ids if c in uploads},
        )
        teacher = self.build_teacher(side, models).to(device)
        student = self.build_student(state, side).to(device)
        start = time.perf_counter()
        student = self.server_train(side, teacher, student)
        log.info(
            "%s: server training %.1fs (%s)",
            self.name,
            time.perf_counter() - start,
            ", ".join(f"{k} {v:.1f}s" for k, v in side.timer.seconds.items()),
        )
        return {
            **state,
            "server": cpu_state(student.eval()),
            "phases": side.timer.as_dict(),
            "artifacts": dict(side.artifacts),
        }

    # --- pieces a subclass may override ---------------------------------------------
    def build_teacher(self, side: ServerSide, models: list[nn.Module]) -> EnsembleTeacher:
        return EnsembleTeacher.from_counts(models, side.num_samples, self.config.weighting)

    def build_student(self, state: dict[str, Any], side: ServerSide) -> nn.Module:
        """The FedAvg (data-size weighted) of the clients, or the common random
        initialisation the clients started from (``init="scratch"``)."""
        if self.config.init == "fedavg":
            ids = side.client_ids
            weights = WEIGHTINGS.get("data_size")(side.num_samples)
            avg = average_states([state["clients"][c] for c in ids], weights)
            return model_from_state(self.run, avg)
        return model_from_state(self.run, state["init"])

    def augment(self) -> Transform | None:
        return build_augment(self.config.augment, self.run.image_shape[-1])

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        """Synthesis + distillation; returns the trained server model."""
        raise NotImplementedError

    # --- helpers of the synthesise-then-distil methods --------------------------------
    def pool_distiller(
        self,
        side: ServerSide,
        teacher: EnsembleTeacher,
        student: nn.Module,
        loss_fn: LossFn | None = None,
    ) -> Distiller:
        """The :class:`Distiller` of the server recipe (``distill``, the
        KD-time ``augment``, the server's generator), shared so that DENSE,
        Co-Boosting, DeepInversion and FedMITR distil the same way."""
        return Distiller(
            student,
            teacher,
            self.config.distill,
            epochs=self.config.epochs,
            device=side.device,
            generator=side.generator,
            augment=self.augment(),
            loss_fn=loss_fn,
        )

    def synthesis_distillation_epochs(
        self,
        side: ServerSide,
        student: nn.Module,
        distiller: Distiller,
        pool: SyntheticPool,
        synthesize: Callable[[int], dict[str, Any]],
        log_values: Callable[[float, dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """The server loop of the pool-based methods: for each of ``epochs``,
        ``synthesize(epoch)`` (timed as ``synthesis``, student frozen and in eval
        mode; it adds to ``pool`` and returns values to log), then one
        ``fit_pool`` (timed as ``distillation``), one log line and a bar step.

        The log line is ``pool``, then ``log_values(mean_kd_loss, values)``
        (default: ``kd_loss`` then the synthesis values).
        """
        epochs = self.config.epochs
        with self.run.progress.task(f"{self.name}: server epochs", epochs) as bar:
            for epoch in range(epochs):
                with side.timer.phase("synthesis"), frozen(student):
                    student.eval()
                    values = synthesize(epoch)
                with side.timer.phase("distillation"):
                    stats = distiller.fit_pool(pool)
                logged = (
                    {"kd_loss": stats.mean_loss, **values}
                    if log_values is None
                    else log_values(stats.mean_loss, values)
                )
                epoch_log(self.name, epoch, epochs, pool=len(pool), **logged)
                info = f"pool {len(pool)}, loss {stats.mean_loss:.3f}"
                bar.advance(description=f"{self.name}: server epochs ({info})")

    # --- protocol ---------------------------------------------------------------------
    def predictor(self, state: dict[str, Any]) -> Predictor:
        if "server" not in state:
            raise ConfigError(f"{self.name}: no server model yet (aggregate has not run)")
        return ModelPredictor(model_from_state(self.run, state["server"]))

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        """The distilled server model only, not the client teachers."""
        return {"server": state["server"]}

    def public_hparams(self) -> dict[str, Any]:
        hp = super().public_hparams()
        hp["fl"] = public_fl_hparams(self.name, self.config)
        return hp

    def starts_from(self) -> str | None:
        return "fedavg" if self.config.init == "fedavg" else None

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Seconds (and FLOPs with ``count_flops``) of each server phase."""
        return {"phases": state["phases"]} if "phases" in state else {}

    def artifacts(self, state: dict[str, Any]) -> dict[str, torch.Tensor]:
        """What ``server_train`` kept in ``side.artifacts`` (e.g. the synthetic pool)."""
        return dict(state.get("artifacts", {}))


@contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """Parameters of ``modules`` stop requiring grad inside the block, so that
    synthesis losses (adversarial / JS terms through the student) do not
    accumulate gradients into them; restored afterwards."""
    params = [p for m in modules for p in m.parameters()]
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, b in zip(params, before, strict=True):
            p.requires_grad_(b)


def epoch_log(name: str, epoch: int, epochs: int, **values: float) -> None:
    """One info line per server epoch (the runtime shows no bar inside aggregate)."""
    every = max(1, epochs // 10)
    if epoch % every == 0 or epoch == epochs - 1:
        text = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k} {v}"
            for k, v in values.items()
        )
        log.info("%s epoch %d/%d: %s", name, epoch + 1, epochs, text)
