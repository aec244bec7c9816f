"""One FAFI client's local work: SALT training and the prototypes it uploads.

Zeng et al., ICML 2025, Algorithm 1 lines 3–8: a client trains its extractor
and prototypes with SALT on two views of every sample (through the shared
client-training cache, under its own objective key), then uploads the
extractor and C×D prototypes. The ablations train the plain CE model instead
(Table 3), and upload the CE head's rows or per-class feature means as
prototypes (Table 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import Compose, Normalize, Transform, build_transform, simclr_pipeline
from osfl.fl.client_training import train_client
from osfl.fl.context import ClientContext
from osfl.methods.fafi.architectures import Architectures
from osfl.methods.fafi.client import FAFINet, TwoViews


def _ce_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Plain CE through a FAFINet's projection and head (SALT off, with a projection)."""
    return F.cross_entropy(model.logits(model.features(x)).float(), y)


def find_normalize(transform: Transform) -> Normalize | None:
    """The last :class:`Normalize` of a (possibly nested) pipeline, or ``None``."""
    if isinstance(transform, Normalize):
        return transform
    found = None
    for t in transform.transforms if isinstance(transform, Compose) else ():
        found = find_normalize(t) or found
    return found


def salt_transform(arches: Architectures, data: ImageSet) -> Transform:
    """Two views of the ``augment`` pipeline at the evaluation resolution,
    normalised with the run's evaluation statistics."""
    run, cfg = arches.run, arches.config
    probe = run.eval_transform(data.images[:1])
    c, h = probe.shape[1], probe.shape[2]
    norm = find_normalize(run.eval_transform)
    mean, std = (norm.mean, norm.std) if norm is not None else ((0.0,) * c, (1.0,) * c)
    if cfg.augment == "simclr":
        base = simclr_pipeline(h, mean, std, crop_scale=cfg.crop_scale)
    else:
        base = build_transform(cfg.augment, image_size=h, mean=mean, std=std)
    return TwoViews(base)


def train_net(
    arches: Architectures, ctx: ClientContext, net: FAFINet, data: ImageSet, arch: str
) -> FAFINet:
    """``net`` trained on ``ctx.device`` with the run's recipe: SALT, or the
    plain CE model when the loss is CE alone (with no projection, the very
    FedAvg / Ensemble client and its cache entry)."""
    cfg, loss, recipe = arches.config, arches.config.loss, arches.run.train
    net.to(ctx.device)  # before the held-rows mask is made where the prototypes live
    if loss.plain_ce and net.head is None:
        train_client(ctx, data, model=net.backbone, cfg=recipe, extra_key=arches.cache_key(arch))
        return net.eval()
    if loss.plain_ce:
        loss_fn, transform, objective = _ce_loss, None, "fafi-ce"
    else:
        loss_fn, transform, objective = loss, salt_transform(arches, data), "fafi"
    extra = {"arch": arches.cache_key(arch), "feature_dim": cfg.feature_dim}
    if objective == "fafi":
        extra["salt"] = loss.key()
    hook = None
    if cfg.proto_update == "held" and objective == "fafi":
        extra["proto_update"] = "held"
        held = torch.bincount(data.labels, minlength=net.prototypes.shape[0]) > 0
        mask = held.to(net.prototypes.device, net.prototypes.dtype)[:, None]
        hook = net.prototypes.register_hook(lambda g: g * mask)
    try:
        train_client(
            ctx,
            data,
            model=net,
            cfg=recipe,
            transform=transform,
            loss_fn=loss_fn,
            objective=objective,
            extra_key=extra,
        )
    finally:
        if hook is not None:
            hook.remove()
    return net.eval()


def class_mean_prototypes(
    net: FAFINet, data: ImageSet, transform: Transform, device: torch.device, batch: int = 256
) -> torch.Tensor:
    """C×D means of the client's normalised features per class; zero rows for
    classes it does not hold (the server averages over the clients that do)."""
    c = net.prototypes.shape[0]
    sums = torch.zeros(c, net.feature_dim, device=device)
    counts = torch.zeros(c, device=device)
    net.eval()
    with torch.no_grad():
        for i in range(0, len(data), batch):
            x = transform(data.images[i : i + batch].to(device))
            y = data.labels[i : i + batch].to(device)
            f = F.normalize(net.features(x).float(), dim=1)
            sums.index_add_(0, y, f)
            counts.index_add_(0, y, torch.ones_like(y, dtype=counts.dtype))
    return (sums / counts.clamp(min=1)[:, None]).cpu()


def client_prototypes(
    arches: Architectures, net: FAFINet, data: ImageSet, device: torch.device
) -> torch.Tensor:
    """The C×D prototypes a trained client uploads (``prototype_kind``)."""
    kind = arches.config.prototype_kind
    if kind == "learned":
        protos = net.prototypes.detach()
    elif kind == "head":
        protos = net.head_weight().detach()
    else:
        protos = class_mean_prototypes(net, data, arches.run.eval_transform, device)
    return protos.float().cpu()
