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
``tests/test_sync_free.py`` counts the waits of a step on a simulated device.

Local training follows FedAvg [McMahan et al., AISTATS 2017]: ``E`` local
epochs (or a fixed number of local steps) of mini-batch training with
cross-entropy, where algorithm-specific terms (FedProx, SCAFFOLD, FedDyn, ...)
plug in through :mod:`osfl.fl.objectives` and method-specific losses (FAFI's
contrastive objective) through ``loss_fn``.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.loader import BatchIterator
from osfl.data.transforms import augmentation_generator, device_path
from osfl.errors import DataError
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.optim import build_optimizer, build_schedule, is_constant_schedule
from osfl.fl.progress import Progress, ProgressTask
from osfl.fl.provenance import compute_dtype
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig

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


@dataclass(frozen=True)
class TrainStats:
    """What one call of :func:`train_local` did. ``first_loss`` / ``final_loss``:
    the mean loss of the first and of the last epoch (or of as many steps);
    ``train_accuracy``: the accuracy on the client's own batches during the
    last epoch (``None`` for a custom ``loss_fn``); ``warnings``: what looked
    wrong (:func:`training_health`, in the active :func:`training_scope`)."""

    steps: int
    samples: int
    epochs: float
    mean_loss: float
    last_loss: float
    seconds: float
    first_loss: float = math.nan
    final_loss: float = math.nan
    train_accuracy: float | None = None
    warnings: tuple[str, ...] = ()
    num_classes: int | None = None  # the width of the logits (None for a custom loss_fn)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: A client whose whole training (a one-shot upload) ends less than this fraction of the
#: way from chance to 100% accuracy on its own training batches has not fitted its data:
#: 32.5% for 10 classes, 50% for 3 (chance is 1/C for C classes).
MIN_SKILL = 0.25
#: A loss that rose by less than this fraction is noise (fresh masks and augmentations
#: every epoch, a learning rate too small to move it), not a warning.
LOSS_RISE_TOLERANCE = 0.05
#: The remedy for a loss that diverged or rose from the start.
LR_HINT = "lower the learning rate (train.lr) or set train.grad_clip"
#: The remedy for a client that trained stably but did not fit its data.
UNDERFIT_HINT = "train longer (train.epochs) or raise the learning rate (train.lr)"


@dataclass(frozen=True)
class TrainingScope:
    """Where a local training sits in its method: ``round`` of a one-round or
    a ``multi_round`` method.

    One round of a multi-round method is one piece of the federation's
    training: it is not expected to fit the client's data (the global model
    learns over the rounds), and from round 1 on it starts from a global model
    fitted to other clients, so its loss may rise on the way to this client's
    data (client drift). Such a training is judged only for divergence.
    """

    round: int = 0
    multi_round: bool = False

    @property
    def from_global_model(self) -> bool:
        """Starts from a model the federation trained (drift is expected)."""
        return self.multi_round and self.round > 0


_SCOPE: ContextVar[TrainingScope | None] = ContextVar("osfl_training_scope", default=None)


@contextmanager
def training_scope(round: int, *, multi_round: bool) -> Iterator[TrainingScope]:
    """Local training run inside the block is ``round`` of a one-round or a
    ``multi_round`` method (the runtimes' client turns set it; outside one, a
    training is a client's whole training and is judged as one)."""
    scope = TrainingScope(round=round, multi_round=multi_round)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def training_health(
    first_loss: float,
    final_loss: float,
    train_accuracy: float | None,
    epochs: float,
    *,
    num_classes: int | None = None,
    scope: TrainingScope | None = None,
) -> tuple[str, ...]:
    """What a finished local training says about itself, each symptom with its remedy.

    - a loss that is not finite: diverged (:data:`LR_HINT`);
    - a loss that rose from the first epoch to the last by more than
      :data:`LOSS_RISE_TOLERANCE`: unstable (:data:`LR_HINT`), unless the
      training started from a global model (round >= 1 of a multi-round
      method: client drift) and ended below chance level (``ln C``, the loss
      of a uniform guess over ``num_classes``);
    - a client's whole training (not one round of several) whose accuracy on
      its own batches stayed within :data:`MIN_SKILL` of chance (``1/C``):
      underfitted (:data:`UNDERFIT_HINT`).

    ``scope`` defaults to the active :func:`training_scope`. Training for a
    fraction of an epoch is not judged.
    """
    scope = scope or _SCOPE.get() or TrainingScope()
    if not (math.isfinite(first_loss) and math.isfinite(final_loss)):
        return (f"local training diverged (loss {final_loss}); {LR_HINT}",)
    found = []
    chance_loss = math.log(num_classes) if num_classes and num_classes > 1 else None
    rose = epochs >= 2 and final_loss > first_loss * (1 + LOSS_RISE_TOLERANCE)
    above_chance = chance_loss is not None and final_loss >= chance_loss
    if rose and (above_chance or not scope.from_global_model):
        level = (
            f", above chance level ({chance_loss:.3g} for {num_classes} classes)"
            if above_chance
            else ""
        )
        found.append(
            f"the local loss rose from {first_loss:.3g} (first epoch) to {final_loss:.3g} "
            f"(last){level}; {LR_HINT}"
        )
    whole = not rose and not scope.multi_round and epochs >= 1
    if whole and train_accuracy is not None and num_classes is not None and num_classes > 1:
        chance = 1 / num_classes
        if train_accuracy < chance + MIN_SKILL * (1 - chance):
            found.append(
                f"did not fit its own data: {100 * train_accuracy:.0f}% accuracy on its "
                f"training batches in the last epoch (chance {100 * chance:.0f}% for "
                f"{num_classes} classes) after {epochs:.3g} epochs; {UNDERFIT_HINT}"
            )
    return tuple(found)


def stats_health(stats: Mapping[str, Any]) -> tuple[str, ...]:
    """:func:`training_health` of a stored :meth:`TrainStats.as_dict` (a client-cache
    hit), judged in the active :func:`training_scope`; an entry without the numbers
    keeps the warnings it was stored with."""
    try:
        return training_health(
            float(stats["first_loss"]),
            float(stats["final_loss"]),
            None if stats.get("train_accuracy") is None else float(stats["train_accuracy"]),
            float(stats["epochs"]),
            num_classes=stats.get("num_classes"),
        )
    except (KeyError, TypeError, ValueError):
        return tuple(str(w) for w in stats.get("warnings") or ())


def _is_convnet(model: nn.Module) -> bool:
    """Whether ``model`` convolves (and so gains from channels_last and
    ``cudnn.benchmark``): a ``Conv2d`` whose kernel is not its stride. A ViT's
    patch embedding (kernel = stride) is a matrix product in disguise."""
    return any(
        isinstance(m, nn.Conv2d) and tuple(m.kernel_size) != tuple(m.stride)
        for m in model.modules()
    )


def _fused(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with ``fused=True`` on CUDA, where torch has fused
    SGD, Adam and AdamW kernels (one launch for all parameters, no host-side
    step counter). Left as it is on the CPU (torch's fused CPU kernels would
    change today's numbers), for other optimizers, and once it has state.
    :func:`osfl.fl.optim.build_optimizer` builds one parameter group from
    ``defaults``, so the rebuild is that optimizer with one option more
    (``optim.py`` could take a ``fused`` flag instead; it is not this
    module's file)."""
    fusable = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
    if device.type != "cuda" or type(optimizer) not in fusable or len(optimizer.param_groups) != 1:
        return optimizer
    if optimizer.state:  # already stepped: keep its state
        return optimizer
    accepted = inspect.signature(type(optimizer).__init__).parameters
    # defaults may hold more than the constructor takes (AdamW's decoupled_weight_decay)
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    defaults.update(fused=True, foreach=None)
    return type(optimizer)(optimizer.param_groups[0]["params"], **defaults)


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
        self.optimizer = _fused(build_optimizer(model.parameters(), cfg), device)
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


class _DeviceLoader(BatchIterator):
    """The loader of the device path: the permutations drawn as the plain
    loader draws them (from the run's CPU generator), sent to the device
    without blocking (from pinned memory on CUDA), so an epoch's first step
    does not wait for the GPU."""

    def _order(self) -> torch.Tensor:
        g = self.generator
        if not self.shuffle or g is None or g.device.type != "cpu" or self.device.type == "cpu":
            return super()._order()
        perm = torch.randperm(self.num_samples, generator=g)
        if self.device.type == "cuda":
            perm = perm.pin_memory()
        return perm.to(self.device, non_blocking=True)


def _loader(
    data: ImageSet, cfg: TrainConfig, generator: torch.Generator, device: torch.device
) -> BatchIterator:
    if len(data) == 0:
        raise DataError("cannot train on an empty client data set")
    cls = _DeviceLoader if device_path(device) else BatchIterator
    loader = cls(
        data.images,
        data.labels,
        cfg.batch_size,
        shuffle=True,
        drop_last=cfg.drop_last,
        generator=generator,
        device=device,
    )
    if len(loader) == 0:
        raise DataError(
            f"client has {len(data)} samples, fewer than batch_size={cfg.batch_size} with "
            "drop_last=True: lower batch_size or set drop_last=false"
        )
    return loader


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
    loader = _loader(data, cfg, generator, device)
    aug_generator = augmentation_generator(generator, device)
    total = cfg.total_steps(len(data))
    model.to(device).train()
    channels_last = device.type == "cuda" and _is_convnet(model)
    if channels_last:
        # NHWC convolutions (tensor cores' layout); cudnn picks each conv's fastest
        # algorithm once per shape (among deterministic ones if those are enforced)
        model.to(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True
    stepper = _Stepper(model, cfg, total, device, terms, loss_fn)
    tap = _STEP_LABELS.get()
    per_epoch = min(len(loader), total)
    loss_sum = torch.zeros((), device=device)
    first = torch.zeros((), device=device)  # loss summed over the first epoch's steps
    final = torch.zeros((), device=device)  # ... over the last epoch's
    correct = torch.zeros((), dtype=torch.int64, device=device)  # last epoch, CE only
    seen = 0
    num_classes: int | None = None
    last = loss_sum
    step = samples = 0
    start = time.perf_counter()
    with _LossBar(progress, description, total, device) as bar:
        while step < total:
            for xb, yb in loader:
                x = transform(xb, aug_generator) if transform is not None else xb.float() / 255
                if channels_last and x.ndim == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                last, logits = stepper(x, yb)
                loss_sum += last
                if step < per_epoch:
                    first += last
                if step >= total - per_epoch:
                    final += last
                    if logits is not None:
                        correct += (logits.argmax(dim=1) == yb).sum()
                        seen += yb.shape[0]
                        num_classes = logits.shape[-1]
                samples += yb.shape[0]
                if on_batch is not None:
                    on_batch(step, x, yb)
                if tap is not None:
                    tap.append(yb.detach())
                step += 1
                bar.advance(step, last)
                if step >= total:
                    break
    if channels_last:  # state dicts leave in the usual layout (serialisers want it)
        model.to(memory_format=torch.contiguous_format)
    epochs = step / len(loader)
    # one read of the five device sums (one wait for a GPU, not five); float64
    # holds each float32 sum and int64 count exactly, so the numbers are those
    # of reading them one by one
    sums = torch.stack([t.double() for t in (first, final, correct, loss_sum, last)])
    first_sum, final_sum, n_correct, total_loss, last_loss = sums.tolist()
    first_loss, final_loss = first_sum / per_epoch, final_sum / per_epoch
    train_accuracy = n_correct / seen if seen else None
    warnings = training_health(
        first_loss, final_loss, train_accuracy, epochs, num_classes=num_classes
    )
    for w in warnings:
        log.warning("%s: %s", description, w)
    report_training_warnings(warnings)
    return TrainStats(
        steps=step,
        samples=samples,
        epochs=epochs,
        mean_loss=total_loss / max(step, 1),
        last_loss=last_loss,
        seconds=time.perf_counter() - start,
        first_loss=first_loss,
        final_loss=final_loss,
        train_accuracy=train_accuracy,
        warnings=warnings,
        num_classes=num_classes,
    )


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
