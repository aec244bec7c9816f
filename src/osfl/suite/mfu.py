"""Model FLOPs utilisation of one training step (issue #32: ViT-B/16 in
bf16, target at least 40 % of the GPU's peak).

One step = forward, cross-entropy, backward and an AdamW update on random
images, under ``torch.autocast`` in ``--dtype`` on a GPU. The FLOPs of a
step are counted once with ``torch.utils.flop_counter.FlopCounterMode``
(matrix products and convolutions, forward and backward: what MFU counts);
MFU = counted FLOPs x steps / measured seconds / the GPU's dense peak for
that dtype (:data:`PEAK_TFLOPS`, from the vendors' data sheets; ``null`` for
a GPU not in the table, and on a CPU).

    osfl suite mfu --model vit_base_patch16_224 --batch 128 --steps 30 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
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


def peak_tflops(gpu: str | None, dtype: str) -> float | None:
    """The table's peak for the first name ``gpu`` contains (``None``: unknown)."""
    if not gpu:
        return None
    for name, peaks in PEAK_TFLOPS.items():
        if name in gpu:
            return peaks.get(dtype)
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="osfl suite mfu", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    return p


def measure(args: argparse.Namespace) -> dict[str, Any]:
    # heavy: torch and the models
    import torch
    from torch.utils.flop_counter import FlopCounterMode  # heavy: torch

    from osfl.fl.provenance import compute_environment  # heavy: torch
    from osfl.models import create_model  # heavy: torch

    device = torch.device(args.device)
    kwargs = {} if args.img_size is None else {"img_size": args.img_size}
    if args.model.startswith("vit_tiny_patch2"):
        kwargs.update(depth=1, embed_dim=32, num_heads=2)
    torch.manual_seed(0)
    model = create_model(args.model, num_classes=10, **kwargs).to(device).train()
    size = model.patch_embed.img_size if hasattr(model, "patch_embed") else (224, 224)
    x = torch.randn(args.batch, 3, *size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = getattr(torch, args.dtype)
    amp = device.type == "cuda" and dtype != torch.float32

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    for _ in range(args.warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - start
    env = compute_environment(device)
    achieved = flops * args.steps / seconds / 1e12
    peak = peak_tflops(env.get("gpu"), args.dtype) if device.type == "cuda" else None
    return {
        "model": args.model,
        "batch": args.batch,
        "image_size": list(size),
        "dtype": args.dtype if amp or dtype == torch.float32 else "float32",
        "steps": args.steps,
        "seconds": seconds,
        "flops_per_step": flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": None if peak is None else achieved / peak,
        "images_per_s": args.batch * args.steps / seconds,
        "provenance": env,
    }


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = measure(args)
    (out / "mfu.json").write_text(json.dumps(result, indent=2) + "\n")
    mfu = result["mfu"]
    print(
        f"{args.model} batch {args.batch} {result['dtype']}: {result['achieved_tflops']:.1f} "
        f"TFLOP/s, MFU {'n/a' if mfu is None else f'{100 * mfu:.1f} %'}"
    )
    return 0
