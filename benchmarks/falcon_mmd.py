"""FALCON Table 4 shape: MMD between each client's real token sequences and
the sequences its generator draws, for the M-AR, AR and NAR generators.

Liu et al., FALCON (2025), §3.4, Table 4 (paper: Tuberculosis / PACS /
OfficeHome, M-AR 0.003227 / 0.002047 / 0.000905). The kernel is a Gaussian
on the flattened sequences with the median-heuristic bandwidth, unbiased
MMD² (:func:`osfl.methods.falcon.mmd2`); the paper does not state its kernel,
so compare orderings, not digits. Tokens and trained generators come from the
run's cache (the same entries ``osfl run`` uses), so after a run of the config
this only samples and measures.

    python benchmarks/falcon_mmd.py configs/falcon_feature_cpu.yaml
    python benchmarks/falcon_mmd.py configs/falcon_feature_cpu.yaml --variants mar,nar \
        data.max_per_class=50 model.kwargs.pretrained=null      # a quick look
"""

from __future__ import annotations

import argparse
import json

import torch

from falcon_common import client, falcon_setup
from osfl.methods.falcon import mmd2
from osfl.methods.falcon.upload import sequences_of, synthetic_counts
from osfl.methods.frozen import token_key_parts


def mmd_per_client(config: str, overrides: list[str], variant: str, max_samples: int) -> dict:
    cfg, ctx, m = falcon_setup(config, overrides, generator=variant)
    enc = m.encoder()
    out = {}
    for c in range(len(ctx.federation.client_indices)):
        cctx, data = client(ctx, c)
        tokens = m.client_tokens(cctx, data, enc)
        key = token_key_parts(cctx, data, enc, m.view_sets())
        gen = m.train_generator(cctx, tokens, data.labels, key)
        counts = synthetic_counts(torch.bincount(data.labels, minlength=ctx.run.num_classes), 1.0)
        sampler = torch.Generator().manual_seed(cctx.seed_for("falcon-mmd"))
        syn = torch.cat(list(sequences_of(gen, counts, sampler).values()))
        pick = torch.Generator().manual_seed(0)
        real = tokens[torch.randperm(len(tokens), generator=pick)[:max_samples]]
        fake = syn[torch.randperm(len(syn), generator=pick)[:max_samples]]
        out[c] = mmd2(real, fake)
    return {"name": cfg.name, "per_client": out, "mean": sum(out.values()) / len(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    ap.add_argument("--variants", default="mar,ar,nar")
    ap.add_argument("--max-samples", type=int, default=2000, help="per side (kernel is O(n^2))")
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_intermixed_args()
    rows = {
        v: mmd_per_client(args.config, args.overrides, v, args.max_samples)
        for v in args.variants.split(",")
    }
    print(f"{'generator':<10} {'mean MMD^2':>12}  per client")
    for v, r in rows.items():
        per = ", ".join(f"{c}: {x:.6f}" for c, x in r["per_client"].items())
        print(f"{v:<10} {r['mean']:>12.6f}  {per}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
