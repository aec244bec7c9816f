"""DINO: self-distillation with no labels.

Caron, Touvron, Misra, Jégou, Mairal, Bojanowski, Joulin, "Emerging Properties
in Self-Supervised Vision Transformers", ICCV 2021 (Algorithm 1; §3.1 and
Appendix of ``main_dino.py`` for the defaults):

- a student ``g_θs`` (the ViT + a projection head) and a teacher ``g_θt`` of the
  same architecture, the teacher an exponential moving average of the student,
  ``θt <- λ θt + (1-λ) θs`` with λ following a cosine from 0.996 to 1 (§3.1);
- multi-crop views (Caron et al., SwAV 2020): two global crops, seen by both
  networks, and ``local_crops`` small crops seen by the student only;
- the loss ``H(Pt(x), Ps(x')) = -Σ Pt log Ps`` summed over every (teacher
  global view, student view) pair of different views, averaged (Eq. 1–2);
- collapse is avoided by *centering* and *sharpening* the teacher's output:
  ``Pt = softmax((gt(x) - c) / τt)`` with a small τt (0.04, warm-up allowed)
  and the centre ``c <- m c + (1-m) mean_batch gt(x)``, m = 0.9 (Eq. 4);
- the head: a 3-layer MLP (GELU) to a ``bottleneck_dim`` code, l2-normalised,
  then a weight-normalised linear layer to ``out_dim`` prototypes whose norm
  is fixed to 1 and which is frozen during the first epoch.

Scaled-down differences, all stated in docs/pretrain.md: a smaller head
(``DinoConfig``); local crops resized to the global resolution (the ViT has a
fixed input size; the paper feeds 96 px local vs 224 px global crops); no
Gaussian blur (meaningless at 16–32 px, as CIFAR recipes of DINO drop it); a
constant weight decay (the paper ramps 0.04 -> 0.4) applied to every
parameter. The written encoder is the teacher's backbone, as in the paper's
evaluations.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.transforms import (
    ColorJitter,
    Compose,
    Normalize,
    RandomApply,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToFloat,
    Transform,
)
from osfl.pretrain.config import PretrainConfig
from osfl.pretrain.objectives import Objective, ObjectiveContext, batches, register_objective


class RandomSolarize(Transform):
    """Invert pixels >= ``threshold`` (images in [0, 1]) with probability ``p``
    per sample: BYOL's and DINO's solarisation of the second global view."""

    def __init__(self, p: float, threshold: float = 0.5):
        self.p, self.threshold = float(p), float(threshold)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        gdev = generator.device if generator is not None else x.device
        u = torch.rand(x.shape[0], generator=generator, device=gdev).to(x.device)
        pick = (u < self.p).view(-1, 1, 1, 1)
        return torch.where(pick & (x >= self.threshold), 1.0 - x, x)


def dino_views(ctx: ObjectiveContext, options: Any) -> tuple[Transform, Transform, Transform]:
    """(global view 1, global view 2, local view) pipelines: DINO's
    ``DataAugmentationDINO`` without the blur, from the project's batched ops."""

    def view(scale: tuple[float, float], solarize: float) -> Transform:
        ops: list[Transform] = [
            ToFloat(),
            RandomResizedCrop(ctx.image_size, scale=scale),
            RandomHorizontalFlip(),
            RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), p=0.8),
            RandomGrayscale(0.2),
        ]
        if solarize > 0:
            ops.append(RandomSolarize(solarize))
        return Compose([*ops, Normalize(ctx.mean, ctx.std)])

    glob = (options.global_crop_min_scale, 1.0)
    local = (options.local_crop_min_scale, options.local_crop_max_scale)
    return view(glob, 0.0), view(glob, options.solarize_p), view(local, 0.0)


class DINOHead(nn.Module):
    """MLP (in -> hidden -> hidden -> bottleneck, GELU), l2-normalise, then the
    weight-normalised prototype layer with its norm fixed to 1 (``weight_g = 1``
    in the paper's code, i.e. every prototype row is unit-norm)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int, bottleneck_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, bottleneck_dim),
        )
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.normalize(self.mlp(x), dim=-1)
        return z @ F.normalize(self.prototypes, dim=-1).t()


def cosine_ramp(start: float, end: float, step: int, total: int) -> float:
    """``end - (end - start) (cos(π t) + 1) / 2`` at t = step / total (clamped)."""
    t = min(max(step / max(total, 1), 0.0), 1.0)
    return end - (end - start) * (math.cos(math.pi * t) + 1) / 2


@register_objective
class Dino(Objective):
    """DINO self-distillation (see the module docstring). Held-out: the DINO
    loss on seeded views of the held-out images, with the final centre."""

    name = "dino"

    @staticmethod
    def options_from(cfg: PretrainConfig) -> Any:
        return cfg.dino

    def __init__(self, model: nn.Module, options: Any, ctx: ObjectiveContext):
        super().__init__(model, options, ctx)
        dim = int(model.num_features)  # type: ignore[arg-type]
        self.head = DINOHead(dim, options.out_dim, options.hidden_dim, options.bottleneck_dim)
        self.teacher = copy.deepcopy(model)
        self.teacher_head = copy.deepcopy(self.head)
        for p in [*self.teacher.parameters(), *self.teacher_head.parameters()]:
            p.requires_grad_(False)
        self.register_buffer("center", torch.zeros(1, options.out_dim))
        self.views = dino_views(ctx, options)
        self.freeze_steps = round(options.freeze_last_layer_epochs * ctx.steps_per_epoch)
        self.warmup_steps = round(options.teacher_temp_warmup * ctx.total_steps)

    def train(self, mode: bool = True) -> Dino:
        super().train(mode)
        self.teacher.eval()  # the teacher only ever runs in inference mode
        self.teacher_head.eval()
        return self

    # -- schedules -------------------------------------------------------
    def teacher_temp(self) -> float:
        o = self.options
        if self.step >= self.warmup_steps:
            return o.teacher_temp
        return o.warmup_teacher_temp + (o.teacher_temp - o.warmup_teacher_temp) * (
            self.step / max(self.warmup_steps, 1)
        )

    def teacher_momentum(self) -> float:
        return cosine_ramp(self.options.momentum_teacher, 1.0, self.step, self.ctx.total_steps)

    # -- the loss --------------------------------------------------------
    def crops(self, x: torch.Tensor, generator: torch.Generator) -> list[torch.Tensor]:
        g1, g2, local = self.views
        return [g1(x, generator), g2(x, generator)] + [
            local(x, generator) for _ in range(self.options.local_crops)
        ]

    def dino_loss(self, student: torch.Tensor, teacher: torch.Tensor, n_crops: int) -> torch.Tensor:
        """Eq. 2: cross-entropy of every student view against every *other*
        teacher (global) view, averaged over the pairs."""
        s = (student / self.options.student_temp).chunk(n_crops)
        t = F.softmax((teacher - self.center) / self.teacher_temp(), dim=-1).chunk(2)
        total, pairs = student.new_zeros(()), 0
        for iq, q in enumerate(t):
            for v, sv in enumerate(s):
                if v == iq:
                    continue
                total = total + torch.sum(-q * F.log_softmax(sv, dim=-1), dim=-1).mean()
                pairs += 1
        return total / pairs

    def forward_pair(
        self, x: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        crops = self.crops(x, generator)
        with torch.no_grad():
            teacher = self.teacher_head(self.teacher.forward_features(torch.cat(crops[:2])))
        student = self.head(self.model.forward_features(torch.cat(crops)))
        return student, teacher, len(crops)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        student, teacher, n = self.forward_pair(x, self.ctx.generator)
        out = self.dino_loss(student.float(), teacher.float(), n)
        with torch.no_grad():  # Eq. 4: the centre follows the teacher's batch mean
            m = self.options.center_momentum
            self.center.mul_(m).add_(teacher.float().mean(0, keepdim=True), alpha=1 - m)
        return out

    def before_step(self) -> None:
        if self.step < self.freeze_steps:  # the paper freezes the prototypes for epoch 1
            self.head.prototypes.grad = None

    @torch.no_grad()
    def after_step(self) -> None:
        m = self.teacher_momentum()
        student = [*self.model.parameters(), *self.head.parameters()]
        teacher = [*self.teacher.parameters(), *self.teacher_head.parameters()]
        torch._foreach_mul_(teacher, m)
        torch._foreach_add_(teacher, student, alpha=1 - m)
        super().after_step()

    # -- results ---------------------------------------------------------
    def encoder(self) -> nn.Module:
        return self.teacher

    @torch.no_grad()
    def evaluate(self, held_out: ImageSet) -> dict[str, float]:
        self.eval()
        gen = torch.Generator().manual_seed(0)  # the same views for every encoder
        total, n = 0.0, 0
        for x, _ in batches(held_out, self.ctx.device):
            student, teacher, crops = self.forward_pair(x, gen)
            total += float(self.dino_loss(student.float(), teacher.float(), crops)) * x.shape[0]
            n += x.shape[0]
        return {"loss": total / n}
