"""The local training engine: one client's SGD/Adam steps on its own data.

Every FL method's ``client_update`` that trains a model calls
:func:`train_local` (or :func:`osfl.fl.client_training.train_client`, its
cached form), so this loop is written once and kept as fast as a hand-written
PyTorch loop (see ``benchmarks/bench_engine.py``): the optimizer is built
once, batches are uint8 tensors indexed in memory and augmented as a whole
batch on the device, the running loss stays on the device (one host sync at
the end), and the only per-step Python is the hooks of the objective terms.

**On a GPU a step never waits for the device** (issue #40): the loader's
permutation goes up without blocking, augmentations draw from a generator on
the device (:func:`osfl.data.transforms.augmentation_generator`), the loss
and accuracy are summed on the device and read once at the end, and the
progress bar reads the loss through a non-blocking copy. There, too,
convnets train in channels_last with ``cudnn.benchmark``, SGD/Adam/AdamW use
torch's fused kernels, ``train.amp`` (on by default) autocasts to bf16, and
``train.compile`` puts the forward through ``torch.compile``. On the CPU
none of this applies and every number is today's, bit for bit;
``tests/fl/test_sync_free.py`` counts the waits of a step on a simulated device.

Local training follows FedAvg [McMahan et al., AISTATS 2017]: ``E`` local
epochs (or a fixed number of local steps) of mini-batch training with
cross-entropy, where algorithm-specific terms (FedProx, SCAFFOLD, FedDyn, ...)
plug in through :mod:`osfl.fl.objectives` and method-specific losses (FAFI's
contrastive objective) through ``loss_fn``.

One of osfl's two image-training loops: :mod:`osfl.fl.batched_training` trains
many clients' copies of one model as one vmapped step (why it is separate: its
docstring); both draw batches with :func:`osfl.data.loader.client_loader` and
keep statistics in :class:`osfl.fl.train_stats.StepTally`. Tensors (features,
tokens) train in :func:`osfl.fl.tensor_fit.fit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.loader import client_loader
from osfl.data.transforms import augmentation_generator, device_path
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.optim import build_optimizer, build_schedule, fused, is_constant_schedule
from osfl.fl.progress import Progress, ProgressTask
from osfl.fl.provenance import compute_dtype
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig

# the record and judgement of a local training moved to osfl.fl.train_stats (shared
# with the batched loop); their names stay importable from here for the runtimes
from osfl.fl.train_stats import (
    LOSS_RISE_TOLERANCE,
    LR_HINT,
    MIN_SKILL,
    UNDERFIT_HINT,
    StepTally,
    TrainingScope,
    TrainStats,
    stats_health,
    training_health,
    training_scope,
)

__all__ = [
    "LOSS_RISE_TOLERANCE",
    "LR_HINT",
    "MIN_SKILL",
    "UNDERFIT_HINT",
    "LossFn",
    "OnBatch",
    "TrainStats",
    "TrainingScope",
    "collect_training_warnings",
    "init_model",
    "record_step_labels",
    "replay_step_labels",
    "report_training_warnings",
    "stats_health",
    "train_local",
    "training_health",
    "training_scope",
]

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform
    from osfl.fl.context import RunContext

log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
OnBatch = Callable[[int, torch.Tensor, torch.Tensor], None]

#: Labels of every local step run under :func:`record_step_labels` (per thread/context).
_STEP_LABELS: ContextVar[list[torch.Tensor] | None] = ContextVar("osfl_step_labels", default=None)


@contextmanager
def record_step_labels() -> Iterator[list[torch.Tensor]]:
    """Collect the label batch of every :func:`train_local` step run inside the block.

    The simulation wraps each ``client_update`` in it, so that a privacy
    audit's ground truth is the labels each local step really used (RLU
    Appendix B.4 scores ``m * |B|`` labels), whatever the method; a context
    variable, so thread-parallel clients each collect their own.
    """
    labels: list[torch.Tensor] = []
    token = _STEP_LABELS.set(labels)
    try:
        yield labels
    finally:
        _STEP_LABELS.reset(token)


#: Warnings of every :func:`train_local` run under :func:`collect_training_warnings`.
_WARNINGS: ContextVar[list[str] | None] = ContextVar("osfl_train_warnings", default=None)


@contextmanager
def collect_training_warnings() -> Iterator[list[str]]:
    """Collect what local training run inside the block said was wrong (a loss
    that diverged or rose, a client that did not learn its own data), so that
    a runtime can put it in the run's record instead of only in a log line."""
    found: list[str] = []
    token = _WARNINGS.set(found)
    try:
        yield found
    finally:
        _WARNINGS.reset(token)


def report_training_warnings(warnings: Sequence[str]) -> None:
    """Hand warnings to the active :func:`collect_training_warnings` block (a
    client-cache hit reports what its training said)."""
    found = _WARNINGS.get()
    if found is not None:
        found.extend(warnings)


def replay_step_labels(labels: Sequence[torch.Tensor]) -> None:
    """Hand recorded per-step label batches to the active :func:`record_step_labels`
    block, if any (a client-cache hit reports the steps its training took)."""
    tap = _STEP_LABELS.get()
    if tap is not None:
        tap.extend(labels)


def _is_convnet(model: nn.Module) -> bool:
    """Whether ``model`` convolves (and so gains from channels_last and
    ``cudnn.benchmark``): a ``Conv2d`` whose kernel is not its stride. A ViT's
    patch embedding (kernel = stride) is a matrix product in disguise."""
    return any(
        isinstance(m, nn.Conv2d) and tuple(m.kernel_size) != tuple(m.stride)
        for m in model.modules()
    )


@contextmanager
def _cuda_layout(model: nn.Module, device: torch.device) -> Iterator[bool]:
    """Train a convnet bound for CUDA in channels_last (NHWC, tensor cores'
    layout), with cudnn picking each conv's fastest algorithm once per shape
    (among deterministic ones if those are enforced); yields whether it does.
    The model leaves in the usual layout (serialisers want it). Elsewhere (the
    CPU, a ViT) nothing changes, so CPU numbers stay today's."""
    if not _is_convnet(model) or device.type != "cuda":
        yield False
        return
    model.to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    yield True
    model.to(memory_format=torch.contiguous_format)


def _batch_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch of images in the layout the model trains in (token and feature
    batches, not 4-d, pass as they are)."""
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.ndim == 4 else x


def _autocast_dtype(device: torch.device) -> torch.dtype:
    # bf16 needs no loss scaling; fp16 (older GPUs) goes through a GradScaler.
    return getattr(torch, compute_dtype(device, amp=True))


class _Stepper:
    """One optimizer step: loss (with the terms' extras, under autocast on
    CUDA), backward, the terms' gradient hooks, clipping, step, schedule."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        total: int,
        device: torch.device,
        terms: Sequence[ObjectiveTerm],
        loss_fn: LossFn | None,
    ):
        self.model, self.cfg, self.terms, self.loss_fn = model, cfg, terms, loss_fn
        self.optimizer = fused(build_optimizer(model.parameters(), cfg), device)
        # the forward the loss runs: compiled on CUDA when train.compile asks
        # (the model itself stays as it is, for hooks, terms and state dicts)
        self.forward_model: nn.Module = (
            torch.compile(model) if cfg.compile and device.type == "cuda" else model  # type: ignore[assignment]
        )
        # a constant lr needs no scheduler: one Python call less per step
        self.schedule = (
            None if is_constant_schedule(cfg) else build_schedule(self.optimizer, cfg, total)
        )
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for term in terms:
            term.setup(model, self.optimizer)
        use_amp = cfg.amp and device.type == "cuda"
        dtype = _autocast_dtype(device) if use_amp else torch.float32
        self.scaler = torch.amp.GradScaler("cuda") if use_amp and dtype == torch.float16 else None
        # hooks and clipping must see true gradients, so unscale fp16 grads before them
        self.unscale = self.scaler is not None and (cfg.grad_clip is not None or bool(terms))
        # entering a disabled autocast still costs a few calls per step: skip it on CPU
        self.autocast: Callable[[], Any] = (
            (lambda: torch.autocast(device.type, dtype=dtype)) if use_amp else nullcontext
        )

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's loss and, for the default cross-entropy, the logits."""
        logits = None
        with self.autocast():
            model = self.forward_model
            if self.loss_fn is not None:
                loss = self.loss_fn(model, x, y)
            else:
                logits = model(x)
                loss = F.cross_entropy(logits, y)
            for term in self.terms:
                extra = term.extra_loss(self.model)
                if extra is not None:
                    loss = loss + extra
        return loss, logits

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step; returns the (detached) loss and logits (``None`` for a
        custom loss)."""
        loss, logits = self.loss(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if self.unscale:
            self.scaler.unscale_(self.optimizer)  # type: ignore[union-attr]
        for term in self.terms:
            term.before_step(self.model)
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.schedule is not None:
            self.schedule.step()
        for term in self.terms:
            term.after_step(self.model)
        return loss.detach(), None if logits is None else logits.detach()


def train_local(
    model: nn.Module,
    data: ImageSet,
    cfg: TrainConfig,
    *,
    transform: Transform | None = None,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    terms: Sequence[ObjectiveTerm] = (),
    loss_fn: LossFn | None = None,
    progress: Progress | None = None,
    description: str = "local training",
    on_batch: OnBatch | None = None,
) -> TrainStats:
    """Train ``model`` in place on ``data`` with ``cfg``; returns :class:`TrainStats`.

    ``transform`` maps a uint8 batch on ``device`` to the model's float input
    (``None``: scale to [0, 1]). ``generator`` fixes the batch order and the
    augmentations (``None``: seed 0), so a run is deterministic on CPU; off
    the CPU the augmentations come from a device generator seeded from it
    (:func:`~osfl.data.transforms.augmentation_generator`: deterministic per
    seed, another stream than the CPU's).
    ``loss_fn(model, x, y)`` replaces cross-entropy; ``terms`` add to the loss
    or correct gradients (see :mod:`osfl.fl.objectives`). ``progress`` shows a
    bar named ``description``. ``on_batch(step, x, y)`` sees every step's
    transformed inputs and labels, in order (privacy audits record the labels
    each local step used).
    """
    device = torch.device(device)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    loader = client_loader(data, cfg.batch_size, cfg.drop_last, generator, device)
    aug_generator = augmentation_generator(generator, device)
    total = cfg.total_steps(len(data))
    model.to(device).train()
    tap = _STEP_LABELS.get()
    with _cuda_layout(model, device) as channels_last:
        stepper = _Stepper(model, cfg, total, device, terms, loss_fn)
        tally = StepTally(total, min(len(loader), total), device)
        step, start = 0, time.perf_counter()
        with _LossBar(progress, description, total, device) as bar:
            while step < total:
                for xb, yb in loader:
                    x = transform(xb, aug_generator) if transform is not None else xb.float() / 255
                    x = _batch_layout(x, channels_last)
                    last, logits = stepper(x, yb)
                    tally.add(step, last, logits, yb)
                    if on_batch is not None:
                        on_batch(step, x, yb)
                    if tap is not None:
                        tap.append(yb.detach())
                    step += 1
                    bar.advance(step, last)
                    if step >= total:
                        break
    stats = tally.stats(step, step / len(loader), time.perf_counter() - start)
    for w in stats.warnings:
        log.warning("%s: %s", description, w)
    report_training_warnings(stats.warnings)
    return stats


class _LossBar:
    """A bar over local steps that shows the loss now and then (~20 times per
    run). On the CPU it reads the loss; off it, reading would wait for the
    device, so the loss goes to the host by a non-blocking copy (into pinned
    memory on CUDA) and the bar shows the copy made at the previous update,
    once CUDA says it has landed."""

    def __init__(
        self,
        progress: Progress | None,
        description: str,
        total: int,
        device: torch.device | None = None,
    ):
        self.task: ProgressTask = (progress or Progress()).task(description, total)
        self.enabled = progress is not None and progress.enabled
        self.description, self.every = description, max(1, total // 20)
        self.blocking = device is None or not device_path(device)
        self.cuda = device is not None and device.type == "cuda"
        self.host: torch.Tensor | None = None
        self.landed: Any = None  # a CUDA event: the copy into self.host is done

    def __enter__(self) -> _LossBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.task.close()

    def advance(self, step: int, loss: torch.Tensor) -> None:
        if self.enabled and step % self.every == 0:
            shown = self._read(loss)
            if shown is None:
                self.task.advance()
            else:
                self.task.advance(description=f"{self.description}  loss {shown:.4f}")
        else:
            self.task.advance()

    def _read(self, loss: torch.Tensor) -> float | None:
        """The loss to show: this step's on the CPU path; off it, the last
        copy that has landed (``None`` before the first), then a new copy."""
        if self.blocking:
            return float(loss)
        shown = None
        if self.host is not None and (self.landed is None or self.landed.query()):
            shown = float(self.host)
        if self.host is None:
            self.host = torch.empty((), dtype=loss.dtype, pin_memory=self.cuda)
        self.host.copy_(loss.detach(), non_blocking=True)
        if self.cuda:
            self.landed = torch.cuda.Event()
            self.landed.record()
        return shown


def init_model(run: RunContext) -> nn.Module:
    """``run.model`` with the run's common initial weights.

    Every client (and the FedAvg-family server, via
    ``osfl.methods.clients.initial_state``) starts from the same weights, drawn
    from a seed that depends on the run seed only; the global torch RNG is
    left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(run.seed, "global-init"))
        return run.model.build(run.num_classes)
