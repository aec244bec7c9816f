"""FALCON's token-sequence generator: a transformer with a block-wise causal
mask and a mixture-density (MDN) head, and its AR / NAR ablations.

Liu et al., "Feature-Aware One-Shot Federated Learning via Hierarchical Token
Sequences" (FALCON, 2025), §2.4, Eqs. 2–5, Fig. 4, Table 3 (AR, NAR) and
Table 4 (MMD of each variant). Every variant models p(s | y) for a token
sequence s = [s⁽⁰⁾, …, s⁽ᴸ⁾] (V = 1 + L tokens of width D) with one
K-component diagonal GMM per token position; they differ in what each
position may condition on (:data:`LAYOUTS`):

``mar`` (the paper's M-AR, Eq. 2–4)
    input [class, s⁽⁰⁾, q₁, …, q_L], with q_l a learned, content-free query
    for region l. Block-wise causal mask (Tian et al., VAR, 2024): the class
    position sees itself; the s⁽⁰⁾ position sees class and s⁽⁰⁾; region
    position l sees class, s⁽⁰⁾ and *only itself* — never another region.
    The class position's output gives p(s⁽⁰⁾ | y) (Eq. 3), region position
    l's gives p(s⁽ˡ⁾ | y, s⁽⁰⁾) (Eq. 4), so the regions are conditionally
    independent given y and s⁽⁰⁾. Sampling takes two passes: s⁽⁰⁾ first,
    then every region from the *same* s⁽⁰⁾ (one s⁽⁰⁾ per sequence, returned
    as token 0: the public code re-draws it, a defect this avoids).
``ar`` (Table 3's "vanilla autoregressive")
    input [class, s⁽⁰⁾, …, s⁽ᴸ⁻¹⁾] with a full causal mask; position t
    predicts s⁽ᵗ⁾ from y and s⁽⁰⁾..s⁽ᵗ⁻¹⁾: p(s|y) = Πₜ p(s⁽ᵗ⁾ | y, s⁽<ᵗ⁾).
    Sampling is token by token (V passes).
``nar`` (Table 3's "non-autoregressive")
    input [class, q₀, …, q_L]; query t sees the class token and itself, so
    every token is drawn at once and independently given y:
    p(s|y) = Πₜ p(s⁽ᵗ⁾ | y). One pass.

The paper defines neither AR nor NAR further; these are the two natural
end points around M-AR (full chain vs no chain) with the same transformer,
head and parameter count.

Tokens are modelled after a per-position, per-dimension standardisation
(client statistics kept as buffers and uploaded with the generator), which
only shifts the NLL by a constant. The NLL is computed in float32 with the
log-variance clamped to ``[logvar_min, logvar_max]`` (the note's advice;
unclamped variances collapse onto training points and the NLL diverges).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.models.layers import LayerNorm, Mlp
from osfl.registry import Registry

__all__ = [
    "LAYOUTS",
    "GeneratorConfig",
    "Layout",
    "SequenceGenerator",
    "gmm_log_prob",
    "sample_gmm",
]


@dataclass(frozen=True)
class GeneratorConfig:
    """Architecture of the generator (paper §3.1: 4 layers, width 768, 16
    heads, K = 20 diagonal components). ``width=null``: the token width D
    (768 for DINOv2-B, as in the paper). ``mlp_ratio=1``: the authors' blocks
    have a 768-wide feed-forward layer, which is what gives the paper's
    generator size (§3.6: ≈144 MB; 146.6 MiB here, tested)."""

    #: transformer layers of the generator
    depth: int = 4
    #: generator width (null: the encoder's token width)
    width: int | None = None
    #: attention heads of the generator
    heads: int = 16
    #: diagonal Gaussian components per output token
    components: int = 20
    #: feed-forward width as a multiple of the generator width
    mlp_ratio: float = 1.0
    #: lower clamp of the components' log-variance
    logvar_min: float = -10.0
    #: upper clamp of the components' log-variance
    logvar_max: float = 6.0

    def __post_init__(self) -> None:
        for name in ("depth", "heads", "components"):
            if getattr(self, name) < 1:
                raise ConfigError(f"generator_model.{name} must be >= 1, got {getattr(self, name)}")
        if self.width is not None and (self.width < 1 or self.width % self.heads):
            raise ConfigError(
                f"generator_model.width={self.width} must be a positive multiple of heads={self.heads}"
            )
        if not self.logvar_min < self.logvar_max:
            raise ConfigError("generator_model.logvar_min must be < logvar_max")
        if self.mlp_ratio <= 0:
            raise ConfigError(f"generator_model.mlp_ratio must be > 0, got {self.mlp_ratio}")


# --------------------------------------------------------------------------- GMM pieces
def gmm_log_prob(
    x: torch.Tensor, logit_pi: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor
) -> torch.Tensor:
    """log Σ_k π_k N(x; μ_k, diag exp(logvar_k)) in float32.

    ``x`` (..., D), ``logit_pi`` (..., K), ``mu``/``logvar`` (..., K, D) -> (...).
    """
    x, logit_pi, mu, logvar = (t.float() for t in (x, logit_pi, mu, logvar))
    d = x.shape[-1]
    sq = ((x.unsqueeze(-2) - mu) ** 2 * torch.exp(-logvar)).sum(-1)
    comp = -0.5 * (sq + logvar.sum(-1) + d * math.log(2 * math.pi))
    return torch.logsumexp(F.log_softmax(logit_pi, dim=-1) + comp, dim=-1)


def sample_gmm(
    logit_pi: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """One draw per row: ``logit_pi`` (N, K), ``mu``/``logvar`` (N, K, D) -> (N, D).

    Random numbers come from ``generator`` on the CPU, so a draw is the same
    on every device.
    """
    probs = F.softmax(logit_pi.float(), dim=-1).cpu()
    comp = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(mu.device)
    rows = torch.arange(mu.shape[0], device=mu.device)
    m, lv = mu[rows, comp].float(), logvar[rows, comp].float()
    eps = torch.randn(m.shape, generator=generator).to(m.device)
    return m + eps * torch.exp(0.5 * lv)


# --------------------------------------------------------------------------- transformer
class MaskedAttention(nn.Module):
    """Multi-head self-attention with a boolean mask (True = may attend)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self._qkv(x)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))

    def attention_weights(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, H, N, N) softmax weights (masked entries exactly 0)."""
        q, k, _ = self._qkv(x)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        return s.masked_fill(~mask, float("-inf")).softmax(dim=-1)


class MaskedBlock(nn.Module):
    """Pre-norm transformer block whose attention follows a mask."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = MaskedAttention(dim, heads)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), nn.GELU)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


# --------------------------------------------------------------------------- layouts
class Layout(ABC):
    """Which positions a variant feeds, masks and reads (see the module docstring)."""

    @abstractmethod
    def length(self, v: int) -> int:
        """Input positions T for sequences of V tokens."""

    @abstractmethod
    def mask(self, v: int) -> torch.Tensor:
        """(T, T) boolean mask, True where row may attend to column."""

    @abstractmethod
    def read(self, v: int) -> list[int]:
        """The input position whose output parameterises token t, for t < V."""

    @abstractmethod
    def inputs(self, g: SequenceGenerator, y: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """(B, T, width) inputs for labels ``y`` and standardised tokens ``z``
        (B, V, D) (teacher forcing; ``None`` or zeros where not yet sampled)."""

    @abstractmethod
    def sample(
        self, g: SequenceGenerator, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """Standardised tokens (B, V, D) drawn for labels ``y``."""


LAYOUTS: Registry[Layout] = Registry("generator variant")


def _draw(g: SequenceGenerator, h: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Sample one token per row of hidden states ``h`` (N, width) -> (N, D)."""
    logit_pi, mu, logvar = g.head(h)
    return sample_gmm(logit_pi, mu, logvar, gen)


class _MAR(Layout):
    def length(self, v: int) -> int:
        return 1 if v == 1 else v + 1

    def mask(self, v: int) -> torch.Tensor:
        t = self.length(v)
        m = torch.eye(t, dtype=torch.bool)
        m[:, 0] = True  # everyone sees the class token
        if t > 1:
            m[1:, 1] = True  # s0 and every region see s0
        return m

    def read(self, v: int) -> list[int]:
        return [0, *range(2, v + 1)]

    def inputs(self, g: SequenceGenerator, y: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        v = g.length
        parts = [g.class_embed(y).unsqueeze(1)]
        if v > 1:
            s0 = z[:, :1] if z is not None else g.zeros_like_tokens(y, 1)
            parts += [g.in_proj(s0), g.queries[1:v].unsqueeze(0).expand(len(y), -1, -1)]
        return torch.cat(parts, dim=1)

    def sample(
        self, g: SequenceGenerator, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        v = g.length
        # step 1: the global token. The class position attends only to itself
        # (the mask's first row), so its output needs the class token alone: one
        # position through the blocks, as the authors' generate_full_proxy does,
        # not the whole sequence
        h = g.hidden(g.class_embed(y).unsqueeze(1))
        s0 = _draw(g, h[:, 0], generator).unsqueeze(1)
        if v == 1:
            return s0
        h = g.hidden(self.inputs(g, y, s0))  # step 2: regions given that same s0
        b = len(y)
        regions = _draw(g, h[:, 2:].reshape(b * (v - 1), -1), generator).reshape(b, v - 1, -1)
        return torch.cat([s0, regions], dim=1)


class _AR(Layout):
    def length(self, v: int) -> int:
        return v

    def mask(self, v: int) -> torch.Tensor:
        return torch.ones(v, v, dtype=torch.bool).tril()

    def read(self, v: int) -> list[int]:
        return list(range(v))

    def inputs(self, g: SequenceGenerator, y: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        v = g.length
        parts = [g.class_embed(y).unsqueeze(1)]
        if v > 1:
            prev = z[:, : v - 1] if z is not None else g.zeros_like_tokens(y, v - 1)
            parts.append(g.in_proj(prev))
        return torch.cat(parts, dim=1)

    def sample(
        self, g: SequenceGenerator, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        v = g.length
        z = g.zeros_like_tokens(y, v)
        for t in range(v):  # token by token: position t sees s⁽<ᵗ⁾ only
            h = g.hidden(self.inputs(g, y, z))
            z = z.clone()
            z[:, t] = _draw(g, h[:, t], generator)
        return z


class _NAR(Layout):
    def length(self, v: int) -> int:
        return v + 1

    def mask(self, v: int) -> torch.Tensor:
        m = torch.eye(v + 1, dtype=torch.bool)
        m[:, 0] = True
        return m

    def read(self, v: int) -> list[int]:
        return list(range(1, v + 1))

    def inputs(self, g: SequenceGenerator, y: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        q = g.queries[: g.length].unsqueeze(0).expand(len(y), -1, -1)
        return torch.cat([g.class_embed(y).unsqueeze(1), q], dim=1)

    def sample(
        self, g: SequenceGenerator, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        v, b = g.length, len(y)
        h = g.hidden(self.inputs(g, y, None))[:, 1:]
        return _draw(g, h.reshape(b * v, -1), generator).reshape(b, v, -1)


LAYOUTS.add("mar", _MAR())
LAYOUTS.add("ar", _AR())
LAYOUTS.add("nar", _NAR())


# --------------------------------------------------------------------------- model
class MDNHead(nn.Module):
    """Hidden state (…, width) -> (logit π (…, K), μ (…, K, D), log σ² (…, K, D)),
    log σ² clamped to the configured range."""

    def __init__(self, width: int, dim: int, components: int, logvar_range: tuple[float, float]):
        super().__init__()
        self.dim, self.k = dim, components
        self.logvar_range = logvar_range
        self.proj = nn.Linear(width, components * (1 + 2 * dim))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.proj(h).float()
        k, d = self.k, self.dim
        # one split, not three slices: a slice's backward writes its gradient into
        # a zero-filled copy of the whole output (three per step, 7 % of a
        # generator step on CPU, BENCHMARKS.md); split's backward concatenates
        logit_pi, mu, logvar = out.split([k, k * d, k * d], dim=-1)
        return (
            logit_pi,
            mu.unflatten(-1, (k, d)),
            logvar.unflatten(-1, (k, d)).clamp(*self.logvar_range),
        )


class SequenceGenerator(nn.Module):
    """Class-conditional generator of token sequences (V, D) for one layout.

    ``nll(y, s)`` is Eq. 5 per sample (summed over positions, standardised
    units), ``loss(y, s)`` what training minimises (its mean over samples and
    positions, as the authors' code); ``sample(y, generator)`` returns
    sequences in token units.
    """

    def __init__(
        self,
        dim: int,
        length: int,
        num_classes: int,
        cfg: GeneratorConfig,
        variant: str = "mar",
    ):
        super().__init__()
        self.layout = LAYOUTS.get(variant)
        self.variant = variant
        self.dim, self.length, self.num_classes = dim, length, num_classes
        width = cfg.width if cfg.width is not None else dim
        if width % cfg.heads:
            raise ConfigError(
                f"generator width {width} (the token width when generator_model.width is null) "
                f"is not divisible by generator_model.heads={cfg.heads}; set one of them"
            )
        self.width = width
        t = self.layout.length(length)
        self.class_embed = nn.Embedding(num_classes, width)
        self.in_proj = nn.Linear(dim, width)
        self.queries = nn.Parameter(torch.zeros(length, width))
        self.pos = nn.Parameter(torch.zeros(t, width))
        self.blocks = nn.ModuleList(
            MaskedBlock(width, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth)
        )
        self.norm = LayerNorm(width)
        self.head = MDNHead(width, dim, cfg.components, (cfg.logvar_min, cfg.logvar_max))
        self.register_buffer("token_mean", torch.zeros(length, dim))
        self.register_buffer("token_std", torch.ones(length, dim))
        self.register_buffer("attn_mask", self.layout.mask(length), persistent=False)
        self.register_buffer("read_idx", torch.tensor(self.layout.read(length)), persistent=False)
        nn.init.trunc_normal_(self.queries, std=0.02)
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.normal_(self.class_embed.weight, std=0.02)

    # --- standardisation ---------------------------------------------------
    def set_token_stats(self, tokens: torch.Tensor) -> None:
        """Per-position, per-dimension mean and std of the training tokens."""
        with torch.no_grad():
            self.token_mean.copy_(tokens.float().mean(0))
            if len(tokens) > 1:
                self.token_std.copy_(tokens.float().std(0, unbiased=False).clamp(min=1e-4))
            else:  # one sample has no spread: model it in token units
                self.token_std.fill_(1.0)

    def standardise(self, s: torch.Tensor) -> torch.Tensor:
        return (s - self.token_mean) / self.token_std

    def unstandardise(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.token_std + self.token_mean

    def zeros_like_tokens(self, y: torch.Tensor, n: int) -> torch.Tensor:
        return torch.zeros(len(y), n, self.dim, device=self.pos.device)

    # --- forward -----------------------------------------------------------
    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, width) inputs -> (B, T, width) outputs under the layout's mask.
        ``T`` may be shorter than the layout's length: the first ``T`` positions,
        which is exact where none of them attends to a later one (the M-AR
        class token)."""
        t = x.shape[1]
        x = x + self.pos[:t]
        mask = self.attn_mask[:t, :t]
        for blk in self.blocks:
            x = blk(x, mask)
        return self.norm(x)

    def params(
        self, y: torch.Tensor, s: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GMM parameters of every token given teacher-forced tokens ``s``
        (B, V, D): logit π (B, V, K), μ and log σ² (B, V, K, D)."""
        h = self.hidden(self.layout.inputs(self, y, self.standardise(s)))
        return self.head(h[:, self.read_idx])

    def token_nll(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """(B, V): the negative log-likelihood of each token of ``s`` under its
        position's mixture (standardised units)."""
        logit_pi, mu, logvar = self.params(y, s)
        return -gmm_log_prob(self.standardise(s), logit_pi, mu, logvar)

    def nll(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Per-sample negative log-likelihood (B,) of token sequences ``s``
        (Eq. 5: the sum over the V positions)."""
        return self.token_nll(y, s).sum(-1)

    def loss(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The training loss: the per-token NLL averaged over samples *and*
        positions, i.e. Eq. 5 / V, as the authors' ``MDNGenerator.nll_loss``
        (``-log_mix.mean()`` over (B, L)). Same minimiser as the sum; the
        scale matters because the gradient clip of 2.0 (theirs) acts on it:
        summing makes the clip V times tighter."""
        return self.token_nll(y, s).mean()

    @torch.no_grad()
    def sample(self, y: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Token sequences (B, V, D) for labels ``y`` (see the layouts)."""
        was = self.training
        self.eval()
        try:
            z = self.layout.sample(self, y.to(self.pos.device), generator)
        finally:
            self.train(was)
        return self.unstandardise(z)
