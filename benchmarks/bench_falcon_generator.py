"""FALCON's generator training step on a CPU: where the time goes, what the
head's one split saves, what bfloat16 autocast gains, and whether the loss
curve stays the same.

Liu et al., "Feature-Aware One-Shot Federated Learning via Hierarchical Token
Sequences" (FALCON), §2.4 (M-AR generator, NLL of Eq. 5) and §3.1 (AdamW,
lr 1e-4, weight decay 1e-4, batch 256). The shape is the cpu configs'
(``configs/falcon_label_cpu.yaml``): ViT-tiny tokens D = 192, 1 global + 2x2
local views (V = 5), K = 20 components, depth 4, 16 heads. The tokens are
synthetic (a class-dependent Gaussian per position, 2,500 sequences: the
size of the cpu scale's largest client); time per step does not depend on
their values, and the loss curves compare arithmetic, not data.

* ``--profile``: torch.profiler's table of one variant's steps (self CPU time).
* default: seconds per step (forward NLL, backward, AdamW step) of every
  variant, interleaved step by step in one process (ratios, not absolute
  times, are what survives a noisy machine): ``slices`` (the head as it was:
  three slices of its output), ``float32`` (osfl's default), ``bfloat16``
  (``generator_fit.amp=true``).
* ``--epochs N``: the mean training NLL of every epoch of ``osfl``'s own
  :func:`~osfl.fl.tensor_fit.fit` for float32 and bfloat16 from one seed,
  and float32 from a second seed (the noise a seed makes).

    python benchmarks/bench_falcon_generator.py [--steps 30] [--profile] [--epochs 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import types

import numpy as np
import torch

from osfl.fl.tensor_fit import FitConfig, fit
from osfl.methods.falcon.generator import GeneratorConfig, MDNHead, SequenceGenerator

D, V, K, CLASSES, N, BATCH = 192, 5, 20, 10, 2500, 256


def tokens(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V, D) class-dependent tokens and their (N,) labels."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    centres = torch.randn(CLASSES, V, D, generator=g)
    return centres[y] + 0.5 * torch.randn(N, V, D, generator=g), y


def slices_head(self: MDNHead, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The head's forward before the split: three slices of one output."""
    out = self.proj(h).float()
    k, d = self.k, self.dim
    mu = out[..., k : k + k * d].unflatten(-1, (k, d))
    logvar = out[..., k + k * d :].unflatten(-1, (k, d)).clamp(*self.logvar_range)
    return out[..., :k], mu, logvar


def new_generator(seed: int, s: torch.Tensor) -> SequenceGenerator:
    torch.manual_seed(seed)
    g = SequenceGenerator(D, V, CLASSES, GeneratorConfig(), variant="mar")
    g.set_token_stats(s)
    return g


def step_times(steps: int) -> dict[str, float]:
    """Median seconds per step of each variant, interleaved."""
    s, y = tokens()
    base = new_generator(0, s)
    models = {name: copy.deepcopy(base) for name in ("slices", "float32", "bfloat16")}
    models["slices"].head.forward = types.MethodType(slices_head, models["slices"].head)
    optims = {
        n: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=1e-4) for n, m in models.items()
    }
    times: dict[str, list[float]] = {n: [] for n in models}
    for i in range(steps + 3):
        idx = torch.arange(i * BATCH, (i + 1) * BATCH) % N
        for name, g in models.items():
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bfloat16"):
                loss = g.nll(y[idx], s[idx]).mean()
            optims[name].zero_grad(set_to_none=True)
            loss.backward()
            optims[name].step()
            if i >= 3:
                times[name].append(time.perf_counter() - t)
    return {n: statistics.median(t) for n, t in times.items()}


def profile(steps: int) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    s, y = tokens()
    g = new_generator(0, s)
    opt = torch.optim.AdamW(g.parameters(), lr=1e-4, weight_decay=1e-4)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            idx = torch.arange(i * BATCH, (i + 1) * BATCH) % N
            loss = g.nll(y[idx], s[idx]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def curves(epochs: int) -> dict[str, list[float]]:
    """Per-epoch mean NLL of fit(): float32 and bfloat16 (seed 0), float32 (seed 1)."""
    s, y = tokens()
    out = {}
    for name, seed, amp in (
        ("float32", 0, False),
        ("bfloat16", 0, True),
        ("float32 seed 1", 1, False),
    ):
        cfg = FitConfig(epochs=epochs, batch_size=BATCH, optimizer="adamw", lr=1e-4,
                        weight_decay=1e-4, amp=amp)  # fmt: skip
        g = new_generator(seed, s)
        out[name] = fit(g, [s, y], lambda m, a, b: m.nll(b, a).mean(), cfg,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--epochs", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, 1 thread")
    if args.profile:
        print(profile(args.steps))
        return
    med = step_times(args.steps)
    for name, t in med.items():
        print(f"{name:>9}: {1000 * t:7.1f} ms/step  ({med['slices'] / t:.2f}x the slices head)")
    if args.epochs:
        c = curves(args.epochs)
        for name, losses in c.items():
            shown = ", ".join(
                f"{losses[e]:.1f}" for e in sorted({0, len(losses) // 2, len(losses) - 1})
            )
            print(f"{name:>15}: NLL at epochs 1 / mid / last: {shown}")
        a, b, other = (np.array(c[k]) for k in c)
        print(f"max |float32 - bfloat16| over epochs: {np.abs(a - b).max():.2f} nats; "
              f"max |seed 0 - seed 1| (float32): {np.abs(a - other).max():.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
