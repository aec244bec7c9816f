"""LoRA for the ViT's linear layers, including slices of a fused ``attn.qkv``.

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022
(Eq. 3): a frozen weight ``W0`` gets a trainable low-rank update,
``h = W0 x + (alpha / r) B A x`` with ``A`` (r × in) drawn like a Linear
weight (Kaiming-uniform, as ``peft``/the reference ``loralib`` do), ``B``
(out × r) zero, so the adapted model starts as the pretrained one. LoRA on the
query and value projections (§7.1, Table 5) is the Fed-LoRA baseline of
EFTViT; FedRA puts it on ``attn.proj`` and ``mlp.fc2``.

timm's ViT fuses q, k and v into one ``attn.qkv`` Linear (out = 3·D), so the
q and v adapters are *slices* of that layer's output: :class:`LoRALinear`
splits the output into ``chunks`` equal parts and adapts only those listed in
``slices`` (q = 0, v = 2). The wrapper keeps the wrapped layer's ``weight``
and ``bias`` as its own parameters, so the frozen parts keep their names
(``blocks.0.attn.qkv.weight``) and pretrained checkpoints load unchanged; the
adapters add ``<layer>.lora_A`` (S × r × in) and ``<layer>.lora_B``
(S × out/chunks × r), one slice per row.

Dropout on the adapter input (LoRA's ``lora_dropout``; FedRA uses 0.1) draws
its masks from an explicit generator (:class:`SeededDropout`): clients train
in threads, and the global torch RNG is never touched by them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError


class SeededDropout(nn.Module):
    """Inverted dropout whose masks come from ``self.generator`` (set by
    :func:`set_dropout_generator` before training), so concurrent clients stay
    deterministic. Without a generator it is ``F.dropout`` (global RNG)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), got {p}")
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.generator is None:
            return F.dropout(x, self.p, training=True)
        keep = torch.rand(x.shape, generator=self.generator, device=self.generator.device)
        return x * (keep.to(x.device) >= self.p).to(x.dtype) / (1.0 - self.p)


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus LoRA on some of its output chunks.

    ``chunks`` splits the output features into equal parts (3 for a fused
    qkv), ``slices`` names the adapted ones (default: all). The adapter
    tensors start empty; :meth:`reset_lora` draws ``A`` and zeroes ``B``.
    """

    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        *,
        dropout: float = 0.0,
        chunks: int = 1,
        slices: Sequence[int] | None = None,
    ):
        super().__init__()
        if rank < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {rank}")
        if base.out_features % chunks:
            raise ConfigError(f"{base.out_features} outputs do not split into {chunks} chunks")
        chosen = tuple(range(chunks)) if slices is None else tuple(sorted(set(slices)))
        if not chosen or chosen[0] < 0 or chosen[-1] >= chunks:
            raise ConfigError(f"slices {slices} must index the {chunks} output chunks")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.rank, self.alpha, self.chunks, self.slices = rank, alpha, chunks, chosen
        self.scaling = alpha / rank
        out_chunk = base.out_features // chunks
        dev, dt = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(
            torch.empty(len(chosen), rank, self.in_features, device=dev, dtype=dt)
        )
        self.lora_B = nn.Parameter(torch.zeros(len(chosen), out_chunk, rank, device=dev, dtype=dt))
        self.dropout = SeededDropout(dropout)

    def reset_lora(self, generator: torch.Generator | None = None) -> None:
        """``A`` like an ``nn.Linear`` weight (Kaiming-uniform, a=√5), ``B = 0``."""
        with torch.no_grad():
            for a in self.lora_A:
                nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
            self.lora_B.zero_()

    def delta_weight(self) -> torch.Tensor:
        """The update ``(alpha/r) B A`` as a full (out × in) matrix (zeros off the slices)."""
        out_chunk = self.out_features // self.chunks
        full = self.weight.new_zeros(self.chunks, out_chunk, self.in_features)
        full[list(self.slices)] = torch.bmm(self.lora_B, self.lora_A) * self.scaling
        return full.reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        z = torch.einsum("...i,sri->...sr", self.dropout(x), self.lora_A)
        d = torch.einsum("...sr,sor->...so", z, self.lora_B) * self.scaling
        if len(self.slices) == self.chunks:
            return out + d.flatten(-2)
        index = torch.tensor(self.slices, device=out.device)
        return out.unflatten(-1, (self.chunks, -1)).index_add(-2, index, d).flatten(-2)

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing the same function (``W0 + (alpha/r) B A``)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        lin = lin.to(self.weight.device, self.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(self.weight + self.delta_weight())
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, rank={self.rank}, "
            f"alpha={self.alpha}, chunks={self.chunks}, slices={self.slices}"
        )


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, leaf = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), leaf


def add_lora(
    model: nn.Module,
    targets: Sequence[str],
    rank: int,
    alpha: float,
    *,
    dropout: float = 0.0,
    chunks: int = 1,
    slices: Sequence[int] | None = None,
) -> list[str]:
    """Wrap every ``nn.Linear`` whose qualified name ends with one of ``targets``
    (e.g. ``"attn.qkv"``) in a :class:`LoRALinear`; returns the wrapped names.

    No random number is drawn (call :func:`reset_lora` for initial values), so
    a client can rebuild the structure and load the broadcast adapters."""
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)
    ]
    if not names:
        raise ConfigError(f"no nn.Linear named *{'/'.join(targets)} to put LoRA on")
    for name in names:
        parent, leaf = _parent(model, name)
        base = getattr(parent, leaf)
        setattr(
            parent,
            leaf,
            LoRALinear(base, rank, alpha, dropout=dropout, chunks=chunks, slices=slices),
        )
    return names


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            yield name, m


def reset_lora(model: nn.Module, generator: torch.Generator | None = None) -> None:
    """Initial adapter values for every LoRA layer (in module order)."""
    for _, m in lora_layers(model):
        m.reset_lora(generator)


def set_dropout_generator(model: nn.Module, generator: torch.Generator | None) -> None:
    """Give every :class:`SeededDropout` of ``model`` this generator."""
    for m in model.modules():
        if isinstance(m, SeededDropout):
            m.generator = generator


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` by its merged ``nn.Linear`` in place
    (inference without adapter overhead; the state dict loses the ``lora_*`` keys)."""
    for name, m in list(lora_layers(model)):
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, m.merged())
    return model
