"""What a FALCON client uploads, and the rule that picks its form.

Liu et al., FALCON (2025), §3.6: a client "can either upload the synthetic
token sequences or the generator model, depending on which option yields a
lower communication cost". The classifier (the distillation teacher, §2.6)
goes up in both forms. The choice here is made on the exact serialised size
of the two candidate messages (:func:`choose_form`), so it accounts for
everything that crosses the network (safetensors header, metadata), not an
estimate.

Wire format (float32 throughout, as the paper's byte counts assume):

- ``classifier.<name>``: the local classifier's state dict (with KD);
- ``sequences.<c>``: (n_c, V, D) synthetic sequences of class c, one tensor
  per class the client sends (the label is the key: no label tensor to keep
  consistent with anything);
- ``generator``: the generator's state dict flattened into one (P,) vector in
  ``state_dict`` order (so a generator is all there or not at all);
- meta ``form`` (``sequences`` | ``generator``), ``num_samples`` and
  ``synthetic_counts`` (per class: what the client sends, or what the server
  should draw from its generator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from osfl.fl.upload import Upload

__all__ = [
    "CLASSIFIER",
    "FORMS",
    "GENERATOR",
    "choose_form",
    "flatten_state",
    "load_flat_state",
    "pick_smaller",
    "sequence_key",
    "sequences_of",
    "synthetic_counts",
]

CLASSIFIER = "classifier."
GENERATOR = "generator"
FORMS = ("sequences", "generator")
_SAMPLE_CHUNK = 1024


def sequence_key(c: int) -> str:
    return f"sequences.{c}"


def synthetic_counts(counts: torch.Tensor, ratio: float) -> torch.Tensor:
    """Synthetic sequences per class: ``round(ratio · n_c)``, at least one for
    a class the client holds, none for a class it lacks (its generator never
    saw it)."""
    n = torch.round(counts.double() * ratio).to(torch.int64)
    return torch.where(counts > 0, n.clamp(min=1), torch.zeros_like(n))


def flatten_state(module: nn.Module) -> torch.Tensor:
    """The module's state dict as one float32 vector (``state_dict`` order)."""
    return torch.cat([t.detach().float().reshape(-1).cpu() for t in module.state_dict().values()])


def load_flat_state(module: nn.Module, flat: torch.Tensor) -> None:
    """Inverse of :func:`flatten_state` (the length is checked by the upload spec)."""
    state, i = {}, 0
    for k, t in module.state_dict().items():
        n = t.numel()
        state[k] = flat[i : i + n].reshape(t.shape).to(t.dtype)
        i += n
    if i != flat.numel():
        raise ValueError(f"flat state has {flat.numel()} values, the module {i}")
    module.load_state_dict(state)


def sequences_of(
    generator: nn.Module, counts: torch.Tensor, sampler: torch.Generator
) -> dict[int, torch.Tensor]:
    """``counts[c]`` sequences of every class c from ``generator``
    (:class:`~osfl.methods.falcon.generator.SequenceGenerator`), on the CPU."""
    out: dict[int, torch.Tensor] = {}
    for c, n in enumerate(int(v) for v in counts):
        if n <= 0:
            continue
        parts = []
        for i in range(0, n, _SAMPLE_CHUNK):
            y = torch.full((min(_SAMPLE_CHUNK, n - i),), c, dtype=torch.int64)
            parts.append(generator.sample(y, sampler).float().cpu())
        out[c] = torch.cat(parts)
    return out


def pick_smaller(sizes: Mapping[str, int]) -> str:
    """The form with the fewest bytes; a tie goes to ``sequences`` (no
    sampling left to the server)."""
    return min(sorted(sizes), key=lambda f: (sizes[f], f != "sequences"))


def candidate_sizes(
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    synth: torch.Tensor,
    generator: nn.Module,
    seq_shape: tuple[int, int],
) -> dict[str, int]:
    """Exact serialised bytes of the upload in each form. Placeholders of the
    right shapes stand in for the sequences and the generator: safetensors'
    size depends on names, dtypes and shapes only, so the byte counts are
    those of the real messages without drawing a single sequence."""
    v, d = seq_shape
    seqs = {sequence_key(c): torch.zeros(int(n), v, d) for c, n in enumerate(synth) if n > 0}
    numel = sum(t.numel() for t in generator.state_dict().values())
    as_seqs = Upload(tensors={**tensors, **seqs}, meta={**meta, "form": "sequences"})
    as_gen = Upload(
        tensors={**tensors, GENERATOR: torch.zeros(numel)}, meta={**meta, "form": "generator"}
    )
    return {"sequences": as_seqs.nbytes, "generator": as_gen.nbytes}


def choose_form(
    mode: str,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    synth: torch.Tensor,
    generator: nn.Module,
) -> str:
    """``mode`` when forced, else the smaller form by exact bytes (§3.6)."""
    if mode != "auto":
        return mode
    shape = (int(generator.length), int(generator.dim))
    return pick_smaller(candidate_sizes(tensors, meta, synth, generator, shape))
