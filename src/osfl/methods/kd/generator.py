"""DENSE's image generator (and FedFTG's conditional variant).

Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022
(code: zj-jayzhang/DENSE ``models/generator.py``, reused by Co-Boosting):

    z (nz=256) -> Linear -> 2·ngf × s × s -> BN
      -> [Upsample ×2 -> Conv3×3 -> BN -> LeakyReLU(0.2)]  (2·ngf, then ngf channels)
      -> Conv3×3 -> C channels -> sigmoid           (images in [0, 1])

with ``ngf=64`` and ``s = img_size / 4`` (128×8×8 at 32 px). Scaled to the
image size: ``s = min(8, ceil(img_size / 4))`` and as many upsampling blocks
as needed to reach ``img_size`` (two at 8–32 px, five at 224 px: 8 -> 256),
the output resized to ``img_size`` when the power of two overshoots. (DENSE's
own ViT runs generate 32 px and upsample ×7; a linear layer to 128×56×56
would hold 100 M weights.)

FedFTG (Zhang et al., CVPR 2022; code: ZhangLin-PKU/FedFTG ``CGeneratorA``)
conditions on the label: ``Linear(z)`` and ``Linear(onehot(y))`` each give
ngf × s × s maps, concatenated into the 2·ngf channels; its output is
``tanh`` followed by a non-affine BatchNorm (``output="tanh_bn"``), i.e. it
is already roughly standardised like a model input.

``output_space`` tells the caller how to feed the models: ``"pixels"`` ([0, 1],
normalise with the run's :class:`~osfl.methods.kd.space.InputSpace`) or
``"inputs"`` (use as is).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.kd.augment import AUGMENTS
from osfl.methods.kd.space import InputSpace

__all__ = [
    "OUTPUTS",
    "Generator",
    "GeneratorConfig",
    "GeneratorLoss",
    "reset_generator",
    "synthesize",
]

OUTPUTS = ("sigmoid", "tanh", "tanh_bn")


@dataclass(frozen=True)
class GeneratorConfig:
    """A server-side generator and how each synthesis round trains it: latent
    size ``nz``, width ``ngf``, ``steps`` Adam steps at ``lr`` per round, the
    augmentation of the generated views the loss sees (``augment``: a KD
    augmentation name, see ``osfl.methods.kd.base.AUGMENTS``), and an optional
    gradient-norm clip. The defaults are DENSE's README (z = 256, 30 steps,
    lr 1e-3, crop + flip)."""

    #: latent size of the generator
    nz: int = 256
    #: width of the generator
    ngf: int = 64
    #: generator Adam steps per synthesis round
    steps: int = 30
    #: generator learning rate
    lr: float = 1e-3
    #: augmentation of the generated images the loss sees: none, flip or crop_flip
    augment: str = "crop_flip"
    #: clip the generator's gradient norm (null: no clipping)
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        if self.nz < 1 or self.ngf < 1:
            raise ConfigError(f"generator: nz and ngf must be >= 1, got {self.nz}, {self.ngf}")
        if self.steps < 1:
            raise ConfigError(f"generator: steps must be >= 1, got {self.steps}")
        if not self.lr > 0:
            raise ConfigError(f"generator: lr must be > 0, got {self.lr}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"generator: grad_clip must be > 0 or null, got {self.grad_clip}")
        AUGMENTS.get(self.augment)  # unknown name -> ConfigError listing the valid ones


class Generator(nn.Module):
    """DENSE's generator; conditional (FedFTG) when ``num_classes > 0``."""

    def __init__(
        self,
        nz: int = 256,
        ngf: int = 64,
        img_size: int = 32,
        channels: int = 3,
        *,
        num_classes: int = 0,
        output: str = "sigmoid",
    ):
        super().__init__()
        for name, v in (("nz", nz), ("ngf", ngf), ("img_size", img_size), ("channels", channels)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"generator {name} must be a positive integer, got {v!r}")
        if output not in OUTPUTS:
            raise ConfigError(
                f"generator output must be one of {', '.join(OUTPUTS)}, got {output!r}"
            )
        self.nz, self.img_size, self.num_classes, self.output = nz, img_size, num_classes, output
        self.init_size = min(8, max(1, math.ceil(img_size / 4)))
        self.num_blocks = max(1, math.ceil(math.log2(img_size / self.init_size)))
        s2 = self.init_size**2
        if num_classes > 0:
            self.l1 = nn.Linear(nz, ngf * s2)
            self.l2 = nn.Linear(num_classes, ngf * s2)
        else:
            self.l1 = nn.Linear(nz, 2 * ngf * s2)
            self.l2 = None
        layers: list[nn.Module] = [nn.BatchNorm2d(2 * ngf)]
        cin = 2 * ngf
        for i in range(self.num_blocks):
            cout = 2 * ngf if i == 0 and self.num_blocks > 1 else ngf
            layers += [
                nn.Upsample(scale_factor=2),
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.LeakyReLU(0.2),
            ]
            cin = cout
        layers.append(nn.Conv2d(cin, channels, 3, padding=1))
        self.blocks = nn.Sequential(*layers)
        self.out_bn = nn.BatchNorm2d(channels, affine=False) if output == "tanh_bn" else None
        reset_generator(self)

    @property
    def output_space(self) -> str:
        """``"pixels"`` ([0, 1]: normalise before the models) or ``"inputs"``."""
        return "pixels" if self.output == "sigmoid" else "inputs"

    def forward(self, z: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        h = self.l1(z.flatten(1))
        if self.l2 is not None:
            if labels is None:
                raise ConfigError("a conditional generator needs labels")
            onehot = F.one_hot(labels, self.num_classes).to(h.dtype)
            h = torch.cat(
                [
                    h.view(h.shape[0], -1, self.init_size, self.init_size),
                    self.l2(onehot).view(h.shape[0], -1, self.init_size, self.init_size),
                ],
                1,
            )
        else:
            h = h.view(h.shape[0], -1, self.init_size, self.init_size)
        x = self.blocks(h)
        if x.shape[-1] != self.img_size:
            x = F.interpolate(
                x, size=(self.img_size, self.img_size), mode="bilinear", align_corners=False
            )
        if self.output == "sigmoid":
            return torch.sigmoid(x)
        x = torch.tanh(x)
        return self.out_bn(x) if self.out_bn is not None else x


def reset_generator(model: nn.Module) -> None:
    """DCGAN initialisation as in DENSE's and Co-Boosting's ``reset_model``:
    conv/linear weights N(0, 0.02), biases 0, BN weights N(1, 0.02).

    Draws from the global torch RNG; callers fork it under a seed."""
    for m in model.modules():
        if isinstance(m, (nn.ConvTranspose2d, nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d) and m.affine:
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


#: ``loss_fn(x, labels) -> (loss, terms)`` on a batch of model inputs.
GeneratorLoss = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def synthesize(
    generator: Generator,
    labels: torch.Tensor,
    loss_fn: GeneratorLoss,
    *,
    iterations: int,
    lr: float,
    betas: tuple[float, float] = (0.5, 0.999),
    space: InputSpace | None = None,
    augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None = None,
    rng: torch.Generator | None = None,
    optimize_z: bool = True,
    grad_clip: float | None = None,
    reset: bool = True,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, dict[str, float]]:
    """One synthesis round of DENSE / Co-Boosting (``synthesize`` in their code).

    Optionally re-initialise the generator (``reset``: both codes call
    ``reset_model`` every round), draw ``z ~ N(0, I)`` (one per label), and take
    ``iterations`` Adam steps (``lr``, ``betas=(0.5, 0.999)``) on the generator's
    parameters and on ``z`` (``optimize_z``) minimising ``loss_fn`` of the
    (augmented) model inputs. Returns the batch with the lowest loss — the
    *un-augmented* model inputs, as the codes store ``best_inputs`` — and its
    loss terms.
    """
    device = torch.device(device)
    generator.to(device).train()
    if reset:  # seeded from ``rng`` so that a run is reproducible
        seed = int(torch.randint(0, 2**62, (1,), generator=rng))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            reset_generator(generator)
    z = torch.randn((labels.shape[0], generator.nz), generator=rng).to(device)
    labels = labels.to(device)
    params: list[dict[str, object]] = [{"params": list(generator.parameters())}]
    if optimize_z:
        z.requires_grad_(True)
        params.append({"params": [z]})
    opt = torch.optim.Adam(params, lr=lr, betas=betas)  # type: ignore[arg-type]
    best: torch.Tensor | None = None
    best_cost, best_terms = float("inf"), {}
    conditional = generator.num_classes > 0
    for _ in range(iterations):
        out = generator(z, labels) if conditional else generator(z)
        x = (
            space.normalize(out)
            if (space is not None and generator.output_space == "pixels")
            else out
        )
        xa = augment(x, rng) if augment is not None else x
        loss, terms = loss_fn(xa, labels)
        cost = float(loss.detach())
        if cost < best_cost or best is None:
            best_cost, best, best_terms = cost, x.detach().clone(), dict(terms)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(generator.parameters(), grad_clip)
        opt.step()
    generator.eval()
    assert best is not None  # iterations >= 1
    return best, best_terms
