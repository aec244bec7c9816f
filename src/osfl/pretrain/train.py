"""Train an encoder on upstream data with a registered objective.

The loop is the project's own (:func:`osfl.fl.training.train_local`): the
objective module is the "model" whose trainable parameters the optimiser
updates, its :meth:`~osfl.pretrain.objectives.Objective.train_loss` the loss
function and its step hooks an objective term, so pretraining gets the same
optimisers and schedules (:mod:`osfl.fl.optim`), gradient clipping, AMP on
CUDA and progress bars as every FL client. Then the encoder is evaluated on
the held-out upstream images; a self-supervised encoder also gets a linear
probe fitted on upstream features as its head (:mod:`osfl.pretrain.probe`), so
the written file never carries an untrained head.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from osfl.data.transforms import build_transform, channel_stats
from osfl.errors import ConfigError
from osfl.fl.progress import Progress
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.models import ImageClassifier, VisionTransformer, create_model
from osfl.pretrain import dino, mae  # noqa: F401  (registers the self-supervised objectives)
from osfl.pretrain.config import PretrainConfig
from osfl.pretrain.objectives import OBJECTIVES, ObjectiveContext
from osfl.pretrain.probe import extract_features, fit_linear_probe
from osfl.pretrain.upstream import Upstream, cap_per_class


@dataclass
class PretrainResult:
    """The trained encoder and what the card reports about its training."""

    encoder: nn.Module
    train: TrainConfig  # as run (warm-up resolved to steps)
    steps: int
    loss_per_epoch: list[float]
    held_out: dict[str, float]
    head: str  # how the written head was obtained
    seconds: float
    device: str
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def final_loss(self) -> float:
        return self.loss_per_epoch[-1] if self.loss_per_epoch else float("nan")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_encoder(
    cfg: PretrainConfig, num_classes: int, image_shape: tuple[int, int, int]
) -> nn.Module:
    """``cfg.model`` with a ``num_classes`` head, initialised from ``cfg.seed``,
    refused up front when its input size or channels do not fit the data."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg.seed, "pretrain-init"))
        model = create_model(cfg.model.name, num_classes=num_classes, **dict(cfg.model.kwargs))
    if not isinstance(model, ImageClassifier):
        raise ConfigError(
            f"model {cfg.model.name!r} is not an image classifier; cannot pretrain it"
        )
    if isinstance(model, VisionTransformer):
        c, h, w = image_shape
        want = (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)
        if want != (c, h, w):
            raise ConfigError(
                f"model {cfg.model.name!r} takes {want[0]}×{want[1]}×{want[2]} images but the "
                f"upstream data is {c}×{h}×{w}; set upstream.image_size / upstream.channels or "
                "model.kwargs.img_size / in_chans to match"
            )
    return model


def pretrain(
    cfg: PretrainConfig, upstream: Upstream, *, progress: Progress | None = None
) -> PretrainResult:
    """Train ``cfg.model`` on ``upstream.train`` with ``cfg.objective``; evaluate on
    ``upstream.held_out``; return the encoder (on the CPU) and its numbers."""
    progress = progress or Progress()
    device = resolve_device(cfg.device)
    train_set = upstream.train
    entry = OBJECTIVES.get(cfg.objective)
    mean, std = channel_stats(train_set)
    model = build_encoder(cfg, train_set.num_classes, train_set.image_shape)
    spe = cfg.train.batches_per_epoch(len(train_set))
    if spe < 1:
        raise ConfigError(
            f"{len(train_set)} upstream images give no full batch of {cfg.train.batch_size}; "
            "lower train.batch_size"
        )
    total = cfg.train.epochs * spe
    train_cfg = dataclasses.replace(
        cfg.train, warmup_steps=min(round(cfg.warmup_epochs * spe), max(total - 1, 0))
    )
    ctx = ObjectiveContext(
        image_size=train_set.image_shape[-1],
        mean=mean,
        std=std,
        num_classes=train_set.num_classes,
        steps_per_epoch=spe,
        total_steps=total,
        generator=torch.Generator().manual_seed(derive_seed(cfg.seed, "pretrain-views")),
        device=device,
    )
    with torch.random.fork_rng(devices=[]):  # the objective's own modules, seeded too
        torch.manual_seed(derive_seed(cfg.seed, "pretrain-objective"))
        objective = entry(model, entry.options_from(cfg), ctx).to(device)
    start = time.perf_counter()
    train_local(
        objective,
        train_set,
        train_cfg,
        device=device,
        generator=torch.Generator().manual_seed(derive_seed(cfg.seed, "pretrain-batches")),
        terms=[objective.term()],
        loss_fn=objective.train_loss,
        progress=progress,
        description=f"pretrain: {entry.name}, {cfg.train.epochs} epochs",
    )
    held_out = objective.evaluate(upstream.held_out)
    encoder = objective.encoder()
    head = "trained on the upstream labels (supervised)"
    if not entry.trains_head:
        held_out |= fit_probe_head(encoder, upstream, cfg, mean, std, device, progress)
        head = "linear probe on frozen upstream-train features (logistic regression)"
    return PretrainResult(
        encoder=encoder.cpu().eval(),
        train=train_cfg,
        steps=objective.step,
        loss_per_epoch=objective.epoch_losses(),
        held_out=held_out,
        head=head,
        seconds=time.perf_counter() - start,
        device=str(device),
        mean=mean,
        std=std,
    )


def fit_probe_head(
    encoder: nn.Module,
    upstream: Upstream,
    cfg: PretrainConfig,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    device: torch.device,
    progress: Progress,
) -> dict[str, Any]:
    """Fit a linear probe on upstream-train features, install it as the
    encoder's head, and return its held-out accuracy."""
    plain = build_transform("none", image_size=None, mean=mean, std=std)
    fit_set = cap_per_class(upstream.train, cfg.probe_max_per_class, cfg.seed)
    feats = extract_features(encoder, fit_set, plain, device=device, progress=progress)
    probe = fit_linear_probe(feats, fit_set.labels.numpy(), fit_set.num_classes, seed=cfg.seed)
    test = extract_features(encoder, upstream.held_out, plain, device=device, progress=progress)
    weight, bias = probe.as_linear()
    head = encoder.get_classifier()  # type: ignore[operator]
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    return {
        "probe_accuracy": probe.accuracy(test, upstream.held_out.labels.numpy()),
        "probe_C": probe.C,
        "probe_train_images": len(fit_set),
    }
