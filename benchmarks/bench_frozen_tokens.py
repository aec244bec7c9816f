"""Frozen-encoder speed: encoding throughput, the token cache, and FALCON's
generator training step.

FALCON (Liu et al., 2025), FedPFT and FedCGS share one expensive client step:
a frozen-encoder forward per HSE view (a global view and L sliding windows,
§3.2) of every image. ``osfl.methods.frozen.tokens.client_tokens`` caches those
tokens by content, so a second method on the same clients reads them. FALCON's
own client cost is then its generator (M-AR, AR or NAR, §3.3/Table 3): 400
epochs of NLL at batch 256 in the paper. This script measures, on one client
of a config, in one process, side by side:

* encoding: images/s and tokens/s of the frozen encoder over the client's
  images, all view families (the cold path of ``client_tokens``);
* the cache: the same call again (warm: every view family read back), and the
  ratio cold / warm, i.e. what a second method on the same clients saves;
* the generator: seconds per training step (forward NLL, backward, AdamW
  step) at the configured batch size, for each variant, median of
  ``--steps`` timed steps after 3 warm-up steps, plus the steps one client
  needs for the configured epochs.

    python benchmarks/bench_frozen_tokens.py [--config configs/falcon_label_cpu.yaml]
        [--client 0] [--steps 20] [--variants mar,ar,nar] [--json OUT] [overrides ...]

BENCHMARKS.md ("Frozen encoder: tokens, cache, FALCON generator") has the
command and the numbers. Do not run it next to other jobs: it times.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time

import torch

from falcon_common import client, falcon_setup
from osfl.fl.optim import build_optimizer


def time_encoding(config: str, overrides: list[str], client_id: int) -> dict[str, float]:
    """Cold then warm ``client_tokens`` on a fresh cache directory."""
    with tempfile.TemporaryDirectory() as tmp:
        _, ctx, m = falcon_setup(config, [*overrides, f"cache_dir={tmp}"])
        enc = m.encoder()
        cctx, data = client(ctx, client_id)
        t0 = time.perf_counter()
        tokens = m.client_tokens(cctx, data, enc)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = m.client_tokens(cctx, data, enc)
        warm = time.perf_counter() - t0
    if not torch.equal(tokens, again):
        raise RuntimeError("the cached tokens differ from the computed ones")
    n, v, _ = tokens.shape
    return {
        "images": n,
        "views_per_image": v,
        "token_dim": int(tokens.shape[2]),
        "encode_s": cold,
        "images_per_s": n / cold,
        "tokens_per_s": n * v / cold,
        "cached_read_s": warm,
        "cold_over_warm": cold / warm,
    }


def time_generator(
    config: str, overrides: list[str], client_id: int, variant: str, steps: int
) -> dict[str, float]:
    """Median seconds per generator training step on the client's real tokens."""
    _, ctx, m = falcon_setup(config, overrides, generator=variant)
    enc = m.encoder()
    cctx, data = client(ctx, client_id)
    tokens, labels = m.client_tokens(cctx, data, enc), data.labels
    gen = m.new_generator()
    gen.set_token_stats(tokens)
    gen.train()
    cfg = m.config.generator_fit
    opt = build_optimizer([p for p in gen.parameters() if p.requires_grad], cfg.optim())
    batch = min(cfg.batch_size, len(tokens))
    sampler = torch.Generator().manual_seed(0)
    times = []
    for i in range(steps + 3):
        idx = torch.randint(len(tokens), (batch,), generator=sampler)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = gen.nll(labels[idx], tokens[idx]).mean()
        loss.backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    per_epoch = math.ceil(len(tokens) / cfg.batch_size)
    step_s = statistics.median(times)
    return {
        "batch": batch,
        "step_s": step_s,
        "parameters": sum(p.numel() for p in gen.parameters()),
        "steps_per_client": per_epoch * cfg.epochs,
        "client_s_estimate": step_s * per_epoch * cfg.epochs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/falcon_label_cpu.yaml")
    p.add_argument("--client", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--variants", default="mar,ar,nar")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.manual_seed(0)
    out: dict[str, object] = {"threads": torch.get_num_threads()}
    enc = time_encoding(args.config, args.overrides, args.client)
    out["encoding"] = enc
    print(
        f"encoding: {enc['images']} images x {enc['views_per_image']} views in "
        f"{enc['encode_s']:.2f} s = {enc['images_per_s']:.1f} images/s, "
        f"{enc['tokens_per_s']:.1f} tokens/s; cached read {enc['cached_read_s']:.3f} s "
        f"({enc['cold_over_warm']:.0f}x faster)"
    )
    out["generator"] = {}
    for variant in args.variants.split(","):
        g = time_generator(args.config, args.overrides, args.client, variant, args.steps)
        out["generator"][variant] = g
        print(
            f"generator {variant:>4}: {1000 * g['step_s']:.1f} ms/step at batch {g['batch']} "
            f"({g['parameters']:,} parameters); {g['steps_per_client']} steps per client "
            f"= {g['client_s_estimate']:.0f} s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
