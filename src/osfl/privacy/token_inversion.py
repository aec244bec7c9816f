"""Token inversion: how much of a client's images can a server rebuild from
the token sequences it receives?

Liu et al., FALCON (2025), §3.5, Fig. 6 and Table 5: the server trains a
model that maps token sequences back to images, then reconstructs (a) from
the client's *real* token sequences — what a method that uploads real
features (e.g. FedPFT's "send the features" strawman, Beitollahi et al.
2024 §6) would expose — and (b) from the *synthetic* sequences the client
actually uploads. Real reconstructions are scored one to one; a synthetic
sequence has no original, so each original image is scored against its best
reconstruction (the highest PSNR and, separately, the highest SSIM over all
synthetic reconstructions: the paper's conservative, worst-case protocol).

Threat model here: an honest-but-curious server with an auxiliary image set
of the task (``aux``, e.g. a held-out split) and the public encoder and view
recipe (every party knows them). It trains a deterministic decoder — a
linear map from the standardised sequence to a small feature map, then
nearest-upsampling convolution blocks, sigmoid output — with MSE on the
auxiliary images. The paper's attacker is a
conditional generative model, so our numbers are a lower bound on leakage
from a weaker (regression) attacker; the *gap* between real and synthetic
tokens is the quantity of interest.

Input contract (plain data; :mod:`osfl.privacy.token_source`):

- ``obs``: the :class:`~osfl.fl.observation.Observation` of one client's
  upload (used for its ids and ``hparams.method`` in the result, and handed
  to the source);
- ``aux``: an ImageSet, uint8 (N, C, H, W), the server's auxiliary images;
- ``source``: a :class:`~osfl.privacy.token_source.TokenSource` — the public
  encoder (uint8 images -> float32 (N, V, D) tokens) and the synthetic
  sequences (M, V, D) the server holds from the upload. Method-specific ones
  (FALCON's sequences or generator, FedPFT's mixtures) are built on the method
  side (:mod:`osfl.methods.falcon.inversion`,
  :mod:`osfl.methods.fedpft_inversion`); plain ones need no method;
- ``private``: the client's real images (ImageSet), simulation ground truth
  that Observations do not record, to score against.

The result is images and PSNR/SSIM, not label counts, so reconstruction
attacks have their own small registry, :data:`RECONSTRUCTION_ATTACKS`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError, DataError
from osfl.fl.tensor_fit import FitConfig, fit
from osfl.privacy.label_recovery.base import ObservationError
from osfl.privacy.metrics import psnr, ssim
from osfl.privacy.token_source import TokenEncoder, TokenSource
from osfl.registry import Registry

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.fl.observation import Observation

__all__ = [
    "RECONSTRUCTION_ATTACKS",
    "ReconstructionResult",
    "TokenDecoder",
    "TokenInversion",
    "TokenInversionConfig",
    "best_match_scores",
    "register_reconstruction_attack",
    "run_reconstruction_attack",
]


# --------------------------------------------------------------------------- decoder
def _upsamplings(size: int, base_min: int = 4, most: int = 6) -> int:
    """How many ×2 upsamplings reach ``size`` from a base map of at least ``base_min``."""
    u = 0
    while u < most and size % (2 ** (u + 1)) == 0 and size // 2 ** (u + 1) >= base_min:
        u += 1
    return u


class TokenDecoder(nn.Module):
    """Token sequence (B, V, D) -> image (B, C, H, W) in [0, 1].

    Standardised input (auxiliary-set statistics, kept as buffers) -> linear
    -> (width, H/2ᵘ, W/2ᵘ) -> u × [nearest ×2, conv3×3, GELU] -> conv3×3 ->
    sigmoid.
    """

    def __init__(self, v: int, d: int, image_shape: tuple[int, int, int], width: int = 64):
        super().__init__()
        c, h, w = image_shape
        self.u = _upsamplings(min(h, w))
        self.base = (h // 2**self.u, w // 2**self.u)
        self.width = width
        self.fc = nn.Linear(v * d, width * self.base[0] * self.base[1])
        layers: list[nn.Module] = []
        ch = width
        for _ in range(self.u):
            nxt = max(ch // 2, 16)
            layers += [nn.Upsample(scale_factor=2), nn.Conv2d(ch, nxt, 3, padding=1), nn.GELU()]
            ch = nxt
        layers.append(nn.Conv2d(ch, c, 3, padding=1))
        self.net = nn.Sequential(*layers)
        self.register_buffer("mean", torch.zeros(v, d))
        self.register_buffer("std", torch.ones(v, d))

    def set_stats(self, tokens: torch.Tensor) -> None:
        with torch.no_grad():
            self.mean.copy_(tokens.mean(0))
            if len(tokens) > 1:
                self.std.copy_(tokens.std(0, unbiased=False).clamp(min=1e-4))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        z = ((s - self.mean) / self.std).flatten(1)
        x = F.gelu(self.fc(z)).reshape(-1, self.width, *self.base)
        return torch.sigmoid(self.net(x))


# --------------------------------------------------------------------------- scores
def best_match_scores(
    originals: torch.Tensor, recons: torch.Tensor, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per original image: the highest PSNR and the highest SSIM over all
    reconstructions (each maximised on its own, Table 5's protocol). PSNR is
    computed for all pairs at once (the same formula as
    :func:`osfl.privacy.metrics.psnr`: images clamped to [0, 1], data range 1)."""
    x = originals.float().clamp(0, 1).flatten(1)
    best_p = torch.full((len(originals),), -math.inf)
    best_s = torch.full((len(originals),), -math.inf)
    for j in range(0, len(recons), chunk):
        r = recons[j : j + chunk]
        mse = torch.cdist(x, r.float().clamp(0, 1).flatten(1)).pow(2) / x.shape[1]
        best_p = torch.maximum(best_p, (-10 * torch.log10(mse.clamp(min=1e-10))).amax(1))
        for i, img in enumerate(originals):
            best_s[i] = max(float(best_s[i]), float(ssim(img.expand_as(r), r).max()))
    return best_p, best_s


@dataclass(frozen=True)
class ReconstructionResult:
    """Mean PSNR (dB) / SSIM of reconstructions from real and from synthetic
    token sequences (Table 5), with per-image values and the images."""

    attack: str
    psnr_real: float
    ssim_real: float
    psnr_synthetic: float | None
    ssim_synthetic: float | None
    num_targets: int
    num_synthetic: int
    info: dict[str, Any] = field(default_factory=dict)
    images: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able scores (no images)."""
        return {
            "attack": self.attack,
            "psnr_real": self.psnr_real,
            "ssim_real": self.ssim_real,
            "psnr_synthetic": self.psnr_synthetic,
            "ssim_synthetic": self.ssim_synthetic,
            "num_targets": self.num_targets,
            "num_synthetic": self.num_synthetic,
            **self.info,
        }


# --------------------------------------------------------------------------- attack
class ReconstructionAttack(ABC):
    """Base of reconstruction attacks: ``Config`` (frozen dataclass) + ``recover``."""

    name: ClassVar[str] = "reconstruction"
    Config: ClassVar[type] = object

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    @abstractmethod
    def recover(
        self,
        obs: Observation,
        aux: ImageSet,
        *,
        source: TokenSource,
        private: ImageSet,
        device: torch.device | str = "cpu",
    ) -> ReconstructionResult:
        """Reconstruct ``obs``'s client from what the server saw, scored on ``private``."""


RECONSTRUCTION_ATTACKS: Registry[type[ReconstructionAttack]] = Registry("reconstruction attack")


def register_reconstruction_attack(name: str):
    """Class decorator: register a :class:`ReconstructionAttack` under ``name``."""

    def deco(cls: type[ReconstructionAttack]) -> type[ReconstructionAttack]:
        cls.name = name.lower()
        RECONSTRUCTION_ATTACKS.add(name, cls)
        return cls

    return deco


@dataclass(frozen=True)
class TokenInversionConfig:
    """Decoder training (``epochs`` over the auxiliary set, Adam at ``lr``,
    ``width`` channels at the base map) and scoring budget (``max_targets``
    of the client's images, ``max_synthetic`` synthetic sequences; seeded)."""

    epochs: int = 100
    batch_size: int = 64
    lr: float = 1e-3
    width: int = 64
    max_targets: int = 64
    max_synthetic: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "width", "max_targets", "max_synthetic"):
            if getattr(self, name) < 1:
                raise ConfigError(f"token_inversion: {name} must be >= 1")
        if not self.lr > 0:
            raise ConfigError(f"token_inversion: lr must be > 0, got {self.lr}")


@register_reconstruction_attack("token_inversion")
class TokenInversion(ReconstructionAttack):
    """Train a token -> image decoder on the auxiliary set, then invert the
    client's real and synthetic sequences (module docstring)."""

    Config: ClassVar[type] = TokenInversionConfig
    config: TokenInversionConfig

    def train_decoder(
        self, aux: ImageSet, encode: TokenEncoder, device: torch.device
    ) -> tuple[TokenDecoder, list[float]]:
        cfg = self.config
        tokens = encode(aux.images, device)
        if tuple(tokens.shape[1:]) != (encode.num_views, encode.dim):
            raise DataError(
                f"the token encoder made shape {tuple(tokens.shape)}, it declares "
                f"(N, {encode.num_views}, {encode.dim})"
            )
        target = aux.images.float() / 255
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            dec = TokenDecoder(tokens.shape[1], tokens.shape[2], tuple(aux.image_shape), cfg.width)
        dec.set_stats(tokens)
        losses = fit(
            dec,
            [tokens, target],
            lambda m, s, x: F.mse_loss(m(s), x),
            FitConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, optimizer="adam", lr=cfg.lr),
            generator=torch.Generator().manual_seed(cfg.seed),
            device=device,
            description="token inversion: decoder",
        )
        return dec.eval(), losses

    def recover(
        self,
        obs: Observation,
        aux: ImageSet,
        *,
        source: TokenSource,
        private: ImageSet,
        device: torch.device | str = "cpu",
    ) -> ReconstructionResult:
        cfg = self.config
        device = torch.device(device)
        if aux is None or len(aux) == 0:
            raise ConfigError("token_inversion needs an auxiliary ImageSet (aux=)")
        if private is None or len(private) == 0:
            raise ConfigError("token_inversion needs the client's real images (private=) to score")
        if not isinstance(source, TokenSource):
            raise ConfigError(
                "token_inversion needs source= with .encode and .synthetic(obs, generator) "
                f"(osfl.privacy.token_source.TokenSource), got {type(source).__name__}"
            )
        method, encode = str(obs.hparams.get("method", "")), source.encode
        gen = torch.Generator().manual_seed(cfg.seed)
        synthetic = source.synthetic(obs, gen)
        if synthetic.shape[1:] != (encode.num_views, encode.dim):
            raise ObservationError(
                f"synthetic sequences of shape {tuple(synthetic.shape[1:])}, the encoder makes "
                f"{(encode.num_views, encode.dim)}",
                field="upload",
                client=obs.client_id,
                round=obs.round,
            )
        decoder, losses = self.train_decoder(aux, encode, device)
        pick = np.random.default_rng(cfg.seed)
        idx = np.sort(pick.permutation(len(private))[: cfg.max_targets])
        originals = private.images[idx].float() / 255
        with torch.no_grad():
            real = decoder(encode(private.images[idx], device).to(device)).cpu()
        if len(synthetic) > cfg.max_synthetic:
            synthetic = synthetic[np.sort(pick.permutation(len(synthetic))[: cfg.max_synthetic])]
        info = {"method": method, "decoder_final_mse": losses[-1], "client": obs.client_id}
        images = {"originals": originals, "real": real}
        if len(synthetic) == 0:
            p_syn = s_syn = None
        else:
            with torch.no_grad():
                rec = torch.cat(
                    [
                        decoder(synthetic[i : i + 256].to(device)).cpu()
                        for i in range(0, len(synthetic), 256)
                    ]
                )
            bp, bs = best_match_scores(originals, rec)
            p_syn, s_syn = float(bp.mean()), float(bs.mean())
            images["synthetic"] = rec
            info["psnr_synthetic_per_image"] = bp.tolist()
            info["ssim_synthetic_per_image"] = bs.tolist()
        p_real, s_real = psnr(real, originals), ssim(real, originals)
        info["psnr_real_per_image"] = p_real.tolist()
        info["ssim_real_per_image"] = s_real.tolist()
        return ReconstructionResult(
            attack=self.name,
            psnr_real=float(p_real.mean()),
            ssim_real=float(s_real.mean()),
            psnr_synthetic=p_syn,
            ssim_synthetic=s_syn,
            num_targets=len(idx),
            num_synthetic=len(synthetic),
            info=info,
            images=images,
        )


def run_reconstruction_attack(
    name: str,
    observation: Observation,
    aux: ImageSet,
    *,
    source: TokenSource,
    private: ImageSet,
    device: torch.device | str = "cpu",
    **options: Any,
) -> ReconstructionResult:
    """Run the registered reconstruction attack ``name`` on ``observation``
    with the method's (or a hand-made) token ``source`` (``**options``: its
    config fields; unknown names or options are a ConfigError)."""
    cls = RECONSTRUCTION_ATTACKS.get(name)
    valid = {f.name for f in fields(cls.Config)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ConfigError(
            f"attack {name!r} has no option(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}"
        )
    return cls(cls.Config(**options)).recover(
        observation, aux, source=source, private=private, device=device
    )
