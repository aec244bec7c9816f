"""Synthesis by optimising pixels with Adam: DeepInversion, ADI, dense SMI.

Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via
DeepInversion", CVPR 2020 (code: NVlabs/DeepInversion). Starting from
Gaussian noise in the model-input space and labels ``y``, minimise

    ce_weight · CE(f(jitter(x)), y)
  + bn_weight · Σ_layers ||μ_l(x) - μ̂_l||₂ + ||σ²_l(x) - σ̂²_l||₂     (needs BatchNorm)
  + tv_l1_weight · TV₁(x) + tv_l2_weight · TV₂(x) + l2_weight · ||x||₂
  - js_weight · JS(f(x), student(x); T)                              (ADI's competition)

with Adam on ``x``; each iteration applies a random roll of up to ``jitter``
pixels and a random horizontal flip (the code's ``lim_0, lim_1`` and
``flip``). ADI (Adaptive DeepInversion) is ``js_weight > 0``: ADI's code adds
``scale · (1 - JS)``, which has the same gradient. For models without BN
(ViTs) the BN term vanishes and this is the *dense* model inversion that
Sparse Model Inversion (SMI) and FedMITR start from (CE + TV + l2 + JS).

The engine is a loop around a caller-supplied ``forward(x_jittered, state)
-> logits``, so other inversion schemes reuse it: FedMITR's sparse inversion
runs its ViT on a subset of tokens inside ``forward`` (reading the jitter in
``state`` to remap patch indices) and freezes stopped patches through
``state.update_mask`` from ``on_step``.

Defaults of :class:`InversionConfig` are FedMITR's Appendix A (100
iterations, Adam lr 1e-3, betas (0.5, 0.99), alpha_TV 1e-4, JS alpha 1.0 when
enabled), the setting the FedMITR paper ran its DeepInversion baseline with;
the DeepInversion code's own CIFAR-10 values (2,000 iterations, lr 0.05,
BN weight 10, TV-l2 2.5e-5) are given in docs/methods/kd.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from osfl.errors import ConfigError
from osfl.methods.kd.priors import BNStatsLoss, js_divergence, l2_prior, tv_loss
from osfl.methods.kd.space import InputSpace

__all__ = [
    "ForwardFn",
    "InversionConfig",
    "InversionResult",
    "InversionState",
    "Jitter",
    "invert",
    "random_labels",
]


@dataclass(frozen=True)
class InversionConfig:
    """Weights and optimiser of pixel inversion (see the module docstring)."""

    #: Adam steps on the pixels per batch
    iterations: int = 100
    #: Adam learning rate on the pixels
    lr: float = 1e-3
    #: Adam beta1
    beta1: float = 0.5
    #: Adam beta2
    beta2: float = 0.99
    #: weight of the cross-entropy to the target labels
    ce_weight: float = 1.0
    #: weight of the BatchNorm-statistics term (models with BatchNorm only)
    bn_weight: float = 0.0
    #: weight of the L1 total-variation prior
    tv_l1_weight: float = 0.0
    #: weight of the L2 total-variation prior
    tv_l2_weight: float = 1e-4
    #: weight of the L2 prior on the pixels
    l2_weight: float = 0.0
    #: weight of the competition with the server model (ADI; 0: off)
    js_weight: float = 0.0
    #: temperature of that competition
    js_temperature: float = 3.0
    #: most pixels of the random roll applied each step
    jitter: int = 2
    #: random horizontal flips each step
    flip: bool = True
    #: standard deviation of the initial noise images
    init_std: float = 1.0
    #: keep the pixels in the valid input range
    clip: bool = True
    #: which batch is kept: best (lowest loss) or last
    keep: str = "best"

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"inversion: {msg}")

        need(self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "betas must lie in [0, 1)")
        for name in (
            "ce_weight",
            "bn_weight",
            "tv_l1_weight",
            "tv_l2_weight",
            "l2_weight",
            "js_weight",
        ):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(self.js_temperature > 0, f"js_temperature must be > 0, got {self.js_temperature}")
        need(self.jitter >= 0, f"jitter must be >= 0, got {self.jitter}")
        need(self.init_std > 0, f"init_std must be > 0, got {self.init_std}")
        need(self.keep in ("best", "last"), f"keep must be 'best' or 'last', got {self.keep!r}")


@dataclass(frozen=True)
class Jitter:
    """One iteration's random shift (``torch.roll`` by ``dy, dx``) and flip."""

    dy: int = 0
    dx: int = 0
    flip: bool = False

    @classmethod
    def draw(cls, max_shift: int, flip: bool, generator: torch.Generator | None) -> Jitter:
        if max_shift == 0 and not flip:
            return cls()
        r = torch.randint(-max_shift, max_shift + 1, (2,), generator=generator).tolist()
        f = bool(torch.rand((), generator=generator) < 0.5) if flip else False
        return cls(int(r[0]), int(r[1]), f)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.dy or self.dx:
            x = torch.roll(x, shifts=(self.dy, self.dx), dims=(-2, -1))
        if self.flip:
            x = torch.flip(x, dims=(-1,))
        return x


@dataclass
class InversionState:
    """What ``forward`` and ``on_step`` see (and may change) at each iteration.

    ``update_mask`` (broadcastable to the pixels, 1 = optimise, 0 = frozen)
    multiplies the gradient before each Adam step and frozen pixels are
    restored after it, so a frozen pixel keeps its value exactly. ``extras`` is free space for an inversion scheme's own state (e.g.
    FedMITR's kept-patch indices).
    """

    step: int
    pixels: torch.Tensor
    labels: torch.Tensor
    jitter: Jitter = field(default_factory=Jitter)
    logits: torch.Tensor | None = None
    update_mask: torch.Tensor | None = None
    losses: dict[str, float] = field(default_factory=dict)
    extras: dict[str, object] = field(default_factory=dict)


@dataclass
class InversionResult:
    images: torch.Tensor  # (B, C, H, W) model-input space, detached
    labels: torch.Tensor  # (B,)
    losses: dict[str, float]  # the kept batch's loss terms
    state: InversionState  # the final state (masks, extras)
    seconds: float


#: ``forward(x_jittered, state) -> logits`` of the model(s) being inverted.
ForwardFn = Callable[[torch.Tensor, InversionState], torch.Tensor]
OnStep = Callable[[InversionState], None]


def random_labels(
    n: int,
    num_classes: int,
    generator: torch.Generator | None = None,
    probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """``n`` labels drawn uniformly (or from ``probs``), FedMITR's "random
    uniformly sampled label"."""
    if probs is None:
        return torch.randint(0, num_classes, (n,), generator=generator)
    p = torch.as_tensor(probs, dtype=torch.float64)
    return torch.multinomial(p, n, replacement=True, generator=generator)


def invert(
    forward: ForwardFn,
    labels: torch.Tensor,
    image_shape: tuple[int, int, int],
    cfg: InversionConfig,
    *,
    space: InputSpace | None = None,
    bn: BNStatsLoss | None = None,
    bn_reduction: str = "sum",
    student: ForwardFn | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    init: torch.Tensor | None = None,
    on_step: OnStep | None = None,
) -> InversionResult:
    """Optimise a batch of images (one per label) by Adam on the pixels.

    ``bn`` must hook the models ``forward`` runs (its statistics are recorded
    around the call). ``student`` (needed when ``js_weight > 0``) gives the
    logits the JS competition compares against. ``space`` gives the valid
    pixel range for ``clip`` (identity when None). Returns the best batch by
    total loss (``keep="best"``, as the DeepInversion and DENSE codes do) or
    the last one.
    """
    device = torch.device(device)
    if cfg.js_weight > 0 and student is None:
        raise ConfigError("js_weight > 0 (ADI / FedMITR competition) needs a student")
    start = time.perf_counter()
    labels = labels.to(device)
    pixels = _initial_pixels(labels.shape[0], image_shape, cfg, space, generator, device, init)
    opt = torch.optim.Adam([pixels], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    state = InversionState(step=0, pixels=pixels, labels=labels)
    kept = _Kept()

    for it in range(cfg.iterations):
        state.step = it
        state.jitter = Jitter.draw(cfg.jitter, cfg.flip, generator)
        x = state.jitter.apply(pixels)
        logits, terms = _forward_terms(forward, x, state, cfg, bn, bn_reduction, device)
        state.logits = logits.detach()
        terms.update(_prior_terms(x, logits, state, cfg, student))
        loss = sum(terms.values()) if terms else logits.sum() * 0.0
        state.losses = {k: float(v.detach()) for k, v in terms.items()}
        if cfg.keep == "best":
            kept.offer(float(loss.detach()), pixels, state.losses)  # type: ignore[union-attr]
        _step(opt, pixels, loss, state.update_mask)  # type: ignore[arg-type]
        if cfg.clip and space is not None:
            with torch.no_grad():
                pixels.copy_(space.clip(pixels))
        if on_step is not None:
            on_step(state)

    if cfg.keep == "last" or kept.pixels is None:
        kept.pixels, kept.losses = pixels.detach().clone(), dict(state.losses)
    return InversionResult(
        images=kept.pixels,
        labels=labels.detach(),
        losses=kept.losses,
        state=state,
        seconds=time.perf_counter() - start,
    )


@dataclass
class _Kept:
    """The batch :func:`invert` returns under ``keep="best"``: the one of lowest
    total loss seen so far (checked before each step, as the DeepInversion and
    DENSE codes do), with its loss terms."""

    cost: float = float("inf")
    pixels: torch.Tensor | None = None
    losses: dict[str, float] = field(default_factory=dict)

    def offer(self, cost: float, pixels: torch.Tensor, losses: dict[str, float]) -> None:
        if cost < self.cost:
            self.cost, self.pixels, self.losses = cost, pixels.detach().clone(), dict(losses)


def _initial_pixels(
    b: int,
    image_shape: tuple[int, int, int],
    cfg: InversionConfig,
    space: InputSpace | None,
    generator: torch.Generator | None,
    device: torch.device,
    init: torch.Tensor | None,
) -> torch.Tensor:
    """The pixels Adam optimises: ``init``, or Gaussian noise of ``cfg.init_std``
    drawn on the CPU (the same images on any device), clipped to the valid range."""
    if init is None:
        init = torch.randn((b, *image_shape), generator=generator) * cfg.init_std
    pixels = init.detach().to(device, torch.float32).clone()
    if cfg.clip and space is not None:
        pixels = space.clip(pixels)
    return pixels.requires_grad_(True)


def _forward_terms(
    forward: ForwardFn,
    x: torch.Tensor,
    state: InversionState,
    cfg: InversionConfig,
    bn: BNStatsLoss | None,
    bn_reduction: str,
    device: torch.device,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The inverted model's logits on ``x`` and, when BatchNorm statistics are
    matched, the ``bn`` term recorded around that same forward pass."""
    if bn is not None and cfg.bn_weight > 0:
        with bn.capture():
            logits = forward(x, state)
        return logits, {"bn": cfg.bn_weight * bn.value(bn_reduction).to(device)}
    return forward(x, state), {}


def _prior_terms(
    x: torch.Tensor,
    logits: torch.Tensor,
    state: InversionState,
    cfg: InversionConfig,
    student: ForwardFn | None,
) -> dict[str, torch.Tensor]:
    """The remaining weighted terms, each present only when its weight is
    positive: cross-entropy to the labels, the image priors and ADI's JS
    competition with the student (negated: the images should make them disagree)."""
    terms: dict[str, torch.Tensor] = {}
    if cfg.ce_weight > 0:
        terms["ce"] = cfg.ce_weight * F.cross_entropy(logits.float(), state.labels)
    if cfg.tv_l1_weight > 0:
        terms["tv_l1"] = cfg.tv_l1_weight * tv_loss(x, "l1")
    if cfg.tv_l2_weight > 0:
        terms["tv_l2"] = cfg.tv_l2_weight * tv_loss(x, "l2")
    if cfg.l2_weight > 0:
        terms["l2"] = cfg.l2_weight * l2_prior(x)
    if cfg.js_weight > 0 and student is not None:
        s_logits = student(x, state)
        terms["js"] = -cfg.js_weight * js_divergence(logits, s_logits, cfg.js_temperature)
    return terms


def _step(
    opt: torch.optim.Optimizer,
    pixels: torch.Tensor,
    loss: torch.Tensor,
    mask: torch.Tensor | None,
) -> None:
    """One Adam step on the pixels; with an update ``mask`` the frozen pixels'
    gradient is zeroed and, since Adam's momentum would still move them, their
    values are restored after the step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if mask is None:
        opt.step()
        return
    before = pixels.detach().clone()
    if pixels.grad is not None:
        pixels.grad.mul_(mask.to(pixels.grad.dtype))
    opt.step()
    with torch.no_grad():
        pixels.copy_(torch.where(mask.to(torch.bool), pixels, before))
