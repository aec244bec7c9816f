"""Model FLOPs utilisation of one training step (issues #32, #50: ViT-B/16
in bf16, target at least 40 % of the GPU's peak), as variants in one call.

One step = forward, cross-entropy, backward and an AdamW update on random
images, under ``torch.autocast`` in ``--dtype`` on a GPU. The FLOPs of a
step are counted once per batch size with
``torch.utils.flop_counter.FlopCounterMode`` on the eager model (matrix
products and convolutions, forward and backward: what MFU counts; a
compiled step does the same arithmetic); MFU = counted FLOPs x steps /
measured seconds / the GPU's dense peak for that dtype (:data:`PEAK_TFLOPS`,
from the vendors' data sheets; ``null`` for a GPU not in the table, and on
a CPU).

``--variants`` times several set-ups of the same step in one call, one
after the other on one model (each from the same initial weights), each a
``+``-joined list of :data:`VARIANT_FLAGS`: ``eager`` (AdamW with its
default multi-tensor kernels, as the first lease measured), ``fused``
(AdamW's fused CUDA kernel: one launch for every parameter),
``compile`` (``torch.compile`` of the model, ``dynamic=False``; its first
step, the compilation, is timed apart as ``compile_s``) and ``bN`` (batch
N instead of ``--batch``). ``mfu.json`` holds every variant and, at the top
level, the best one's figures.

    osfl suite mfu --model vit_base_patch16_224 --batch 128 --steps 30 \
        --variants eager,fused,fused+compile,fused+compile+b256 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Dense (no sparsity) tensor-core peak, TFLOP/s, by GPU name and dtype.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0},
    "H100": {"bfloat16": 989.4, "float16": 989.4},  # SXM / HBM3
    "H200": {"bfloat16": 989.4, "float16": 989.4},
    "A100": {"bfloat16": 312.0, "float16": 312.0},
    "L40S": {"bfloat16": 362.1, "float16": 362.1},
}
#: What a variant may combine (``bN`` besides: batch N).
VARIANT_FLAGS = ("eager", "fused", "compile")


def peak_tflops(gpu: str | None, dtype: str) -> float | None:
    """The table's peak for the first name ``gpu`` contains (``None``: unknown)."""
    if not gpu:
        return None
    for name, peaks in PEAK_TFLOPS.items():
        if name in gpu:
            return peaks.get(dtype)
    return None


@dataclass(frozen=True)
class Variant:
    """One set-up of the step: its name as given, fused AdamW, compiled, batch."""

    name: str
    fused: bool
    compile: bool
    batch: int


def parse_variant(text: str, batch: int) -> Variant:
    """``fused+compile+b256`` -> its :class:`Variant` (an ``argparse`` error
    line for an unknown flag)."""
    flags = [f for f in text.split("+") if f]
    sizes = [f for f in flags if f[:1] == "b" and f[1:].isdigit() and int(f[1:]) > 0]
    unknown = [f for f in flags if f not in VARIANT_FLAGS and f not in sizes]
    if unknown or not flags or len(sizes) > 1:
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: join {', '.join(VARIANT_FLAGS)} and bN (a batch) with '+'"
        )
    size = int(sizes[0][1:]) if sizes else batch
    return Variant(text, "fused" in flags, "compile" in flags, size)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="osfl suite mfu", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--variants",
        default="eager",
        help="comma-separated set-ups to time, each +-joined from "
        f"{', '.join(VARIANT_FLAGS)}, bN (default eager)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile's backend for the compile variants (default inductor)",
    )
    p.add_argument("--out", required=True)
    return p


class _Bench:
    """The model, its initial weights and the inputs the variants share."""

    def __init__(self, args: argparse.Namespace):
        # heavy: torch and the models
        import torch

        from osfl.models import create_model  # heavy: torch

        self.torch, self.args = torch, args
        self.device = torch.device(args.device)
        kwargs: dict[str, Any] = {} if args.img_size is None else {"img_size": args.img_size}
        if args.model.startswith("vit_tiny_patch2"):
            kwargs.update(depth=1, embed_dim=32, num_heads=2)
        torch.manual_seed(0)
        self.model = create_model(args.model, num_classes=10, **kwargs).to(self.device).train()
        self.initial = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        embed = getattr(self.model, "patch_embed", None)
        self.size = tuple(embed.img_size) if embed is not None else (224, 224)
        self.dtype = getattr(torch, args.dtype)
        self.amp = self.device.type == "cuda" and self.dtype != torch.float32
        self.cuda = self.device.type == "cuda"
        self.compiled: Any = None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def batch(self, n: int) -> tuple[Any, Any]:
        g = self.torch.Generator().manual_seed(n)
        x = self.torch.randn(n, 3, *self.size, generator=g).to(self.device)
        y = self.torch.randint(0, 10, (n,), generator=g).to(self.device)
        return x, y

    def step_fn(self, v: Variant, compile_fn: Callable[..., Any]) -> Callable[[], None]:
        torch = self.torch
        self.model.load_state_dict(self.initial)  # every variant from the same weights
        opt_kw: dict[str, Any] = {"fused": True} if v.fused else {}
        opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, **opt_kw)
        if v.compile and self.compiled is None:
            self.compiled = compile_fn(self.model, backend=self.args.compile_backend, dynamic=False)
        forward = self.compiled if v.compile else self.model
        x, y = self.batch(v.batch)

        def step() -> None:
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.amp):
                loss = torch.nn.functional.cross_entropy(forward(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    def flops(self, n: int) -> int:
        """A step's FLOPs at batch ``n`` on the eager model (weights restored after)."""
        from torch.utils.flop_counter import FlopCounterMode  # heavy: torch

        step = self.step_fn(Variant("count", False, False, n), lambda m, **_: m)
        with FlopCounterMode(display=False) as counter:
            step()
        self.model.load_state_dict(self.initial)
        return int(counter.get_total_flops())


def time_variant(
    bench: _Bench, v: Variant, flops: int, peak: float | None, compile_fn: Callable[..., Any]
) -> dict[str, Any]:
    """One variant: its first step (the compilation, if any) timed apart,
    then ``--warmup`` steps, then ``--steps`` timed."""
    args = bench.args
    step = bench.step_fn(v, compile_fn)
    bench.sync()
    t0 = time.perf_counter()
    step()
    bench.sync()
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        step()
    bench.sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    bench.sync()
    seconds = time.perf_counter() - start
    achieved = flops * args.steps / seconds / 1e12
    return {
        "variant": v.name,
        "fused_adamw": v.fused,
        "compiled": v.compile,
        "batch": v.batch,
        "first_step_s": first,
        "compile_s": first if v.compile else None,
        "seconds": seconds,
        "flops_per_step": flops,
        "achieved_tflops": achieved,
        "mfu": None if peak is None else achieved / peak,
        "images_per_s": v.batch * args.steps / seconds,
    }


def measure(
    args: argparse.Namespace, compile_fn: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """Time every variant of ``args.variants``; ``compile_fn`` stands in for
    ``torch.compile`` (tests)."""
    from osfl.fl.provenance import compute_environment  # heavy: torch

    bench = _Bench(args)
    compile_fn = compile_fn or bench.torch.compile
    variants = [parse_variant(t, args.batch) for t in str(args.variants).split(",") if t]
    env = compute_environment(bench.device)
    peak = peak_tflops(env.get("gpu"), args.dtype) if bench.cuda else None
    counted: dict[int, int] = {}
    results = []
    for v in variants:
        if v.batch not in counted:
            counted[v.batch] = bench.flops(v.batch)
        results.append(time_variant(bench, v, counted[v.batch], peak, compile_fn))
    best = max(results, key=lambda r: r["achieved_tflops"])
    return {
        "model": args.model,
        "batch": best["batch"],
        "image_size": list(bench.size),
        "dtype": args.dtype if bench.amp or bench.dtype == bench.torch.float32 else "float32",
        "steps": args.steps,
        "best_variant": best["variant"],
        "seconds": best["seconds"],
        "flops_per_step": best["flops_per_step"],
        "achieved_tflops": best["achieved_tflops"],
        "peak_tflops": peak,
        "mfu": best["mfu"],
        "images_per_s": best["images_per_s"],
        "variants": results,
        "provenance": env,
    }


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    for t in str(args.variants).split(","):
        try:
            parse_variant(t, args.batch)
        except argparse.ArgumentTypeError as e:
            _parser().error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = measure(args)
    (out / "mfu.json").write_text(json.dumps(result, indent=2) + "\n")
    for r in result["variants"]:
        mfu = r["mfu"]
        print(
            f"{args.model} {r['variant']} batch {r['batch']} {result['dtype']}: "
            f"{r['achieved_tflops']:.1f} TFLOP/s, {r['images_per_s']:.0f} images/s, "
            f"MFU {'n/a' if mfu is None else f'{100 * mfu:.1f} %'}"
            + (f", compiled in {r['compile_s']:.1f} s" if r["compiled"] else "")
        )
    return 0
