"""FALCON Table 5 shape: PSNR / SSIM of images rebuilt from a client's real
token sequences vs from the synthetic sequences it uploads.

Liu et al., FALCON (2025), §3.5, Table 5 (OfficeHome: real 27.18 dB / 0.811,
synthetic 13.30 dB / 0.153). The attack (``token_inversion``,
:mod:`osfl.privacy.token_inversion`) trains a decoder on an auxiliary set
(``--aux-per-class`` test images per class, the server's side) from the
Observation of one client's upload through FALCON's adapter
(:func:`osfl.methods.falcon.inversion.falcon_token_source`: the encoder and
views rebuilt from the Observation's public hyper-parameters, the synthetic
sequences read or sampled from the upload) and scores against the client's
real images (simulation ground truth). Synthetic scores are best matches per
image, as in the paper.

    python benchmarks/falcon_inversion.py configs/falcon_feature_cpu.yaml --client 0
    python benchmarks/falcon_inversion.py configs/falcon_label_cpu.yaml --client 2 \
        --epochs 200 --width 128 partition.alpha=0.5
"""

from __future__ import annotations

import argparse
import json

from falcon_common import client, falcon_setup
from osfl.fl.observation import observe
from osfl.methods.falcon.inversion import falcon_token_source
from osfl.privacy import run_reconstruction_attack
from osfl.privacy.audit import aux_set
from osfl.privacy.audit.recorder import observation_hparams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    ap.add_argument("--client", type=int, default=0)
    ap.add_argument("--aux-per-class", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--max-targets", type=int, default=64)
    ap.add_argument("--out", help="write the scores as JSON here")
    args = ap.parse_intermixed_args()

    cfg, ctx, m = falcon_setup(args.config, args.overrides)
    cctx, data = client(ctx, args.client)
    b = m.broadcast(m.init_state(), 0)
    up = m.client_update(cctx, b, data)
    obs = observe(
        args.client,
        0,
        broadcast=b.tensors,
        upload=up.tensors,
        upload_meta=up.meta,
        hparams=observation_hparams(m, ctx.run),
    )
    source = falcon_token_source(
        obs, data.image_shape, ctx.run.eval_transform, run_seed=ctx.run.seed, device=ctx.run.device
    )
    aux = aux_set(ctx.splits.test, args.aux_per_class)
    res = run_reconstruction_attack(
        "token_inversion",
        obs,
        aux,
        source=source,
        private=data,
        device=ctx.run.device,
        epochs=args.epochs,
        width=args.width,
        max_targets=args.max_targets,
    )
    print(
        f"{cfg.name}, client {args.client} ({up.meta['form']} upload), "
        f"encoder weights: {m.encoder().describe()['weights']}"
    )
    print(f"{'tokens':<10} {'PSNR (dB)':>10} {'SSIM':>8}")
    print(f"{'real':<10} {res.psnr_real:>10.2f} {res.ssim_real:>8.4f}")
    if res.psnr_synthetic is not None:
        print(f"{'synthetic':<10} {res.psnr_synthetic:>10.2f} {res.ssim_synthetic:>8.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res.as_dict(), f, indent=2)


if __name__ == "__main__":
    main()
