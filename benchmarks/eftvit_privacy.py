"""EFTViT's privacy claims at cpu scale: feature inversion (§3.6, Fig. 5) and
what median sampling shows of a client's labels (§3.4).

EFTViT ("Efficient Federated Training of Vision Transformers with Masked
Images on Resource-Constrained Clients") argues that its
uploads, the local module's tokens of 25 % of each image's patches, are hard
to turn back into images, and that median sampling hides each client's
class proportions. This script measures both on the run a config describes:

1. **The attacker** is the honest-but-curious server. It holds the pretrained
   local module (public) and auxiliary images from a *different* label set
   (``--aux-classes``: by default the five CIFAR-10 classes the encoder was
   pretrained on, never a client's). It trains two decoders
   (:func:`osfl.privacy.feature_inversion.train_feature_decoder`): one on
   masked tokens (the clients' r) and one on unmasked tokens (the comparison:
   what uploading whole-image features would expose).
2. **Fig. 5's shape**: EFTViT runs in the simulation; every upload of every
   round is inverted and scored against the uploading client's own images of
   the same class (PSNR / SSIM after a minimum-MSE pairing, which favours the
   attacker: the upload does not say which image a feature came from).
3. **Masked against unmasked**, with known pairing on held-out test images:
   the pretrained local module and every client's final (drifted) one,
   inverted by the masked decoder on masked tokens and by the unmasked
   decoder on all tokens. The mean test image is the trivial guess (its PSNR
   is the floor an attack must beat).
4. **Label histograms**: per client, the class histogram the server would
   read with one feature per image and with median sampling, and their
   total-variation distance to the client's true label distribution
   (:func:`osfl.methods.eftvit.privacy.histogram_exposure`).

    python benchmarks/eftvit_privacy.py [--config configs/eftvit_cifar10_cpu.yaml]
        [--rounds 30] [--decoder-steps 2000] [--json out.json] [--figure fig5.png]
        [overrides ...]

REPRODUCTION.md ("EFTViT", privacy) has the command and the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.fl.observers import Observer
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.upload import Upload
from osfl.methods.eftvit.privacy import histogram_exposure
from osfl.privacy.feature_inversion import (
    DecoderConfig,
    encode,
    inversion_curve,
    reconstruct,
    score_upload,
    train_feature_decoder,
)
from osfl.privacy.metrics import psnr, ssim

PRETRAINING_CLASSES = "[airplane,automobile,bird,cat,deer]"


class UploadInverter(Observer):
    """Inverts every upload as it arrives and scores it against the client's images."""

    def __init__(
        self, decoder: Any, client_images: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
    ):
        self.decoder = decoder
        self.client_images = client_images
        self.scores: dict[int, list[dict[str, float]]] = defaultdict(list)

    def on_upload(
        self,
        round: int,
        client: int,
        upload: Upload,
        nbytes: int,
        truth: Mapping[str, Any] | None = None,
    ) -> None:
        images, labels = self.client_images[client]
        self.scores[round].append(score_upload(self.decoder, upload.tensors, images, labels))


def pairs_mean(scores: list[dict[str, float]]) -> dict[str, float]:
    n = sum(s["pairs"] for s in scores)
    return {k: sum(s[k] * s["pairs"] for s in scores) / n for k in ("psnr", "ssim")}


def save_figure(
    path: str, images: torch.Tensor, rows: Mapping[str, Any], num_patches: int, to_input: Any
) -> None:
    """Originals and their reconstructions, one row per (decoder, encoder, r)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen = torch.Generator().manual_seed(0)
    shown = []
    for name, spec in rows.items():
        if spec is None:
            shown.append((name, images))
            continue
        decoder, encoder, ratio = spec
        with torch.no_grad():
            tokens = encode(encoder, to_input(images), num_patches, ratio, gen)
        shown.append((name, reconstruct(decoder, tokens)))
    n = len(images)
    fig, axes = plt.subplots(len(shown), n, figsize=(1.2 * n, 1.3 * len(shown)), squeeze=False)
    for i, (name, batch) in enumerate(shown):
        for j in range(n):
            ax = axes[i, j]
            ax.imshow(batch[j].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(name, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/eftvit_cifar10_cpu.yaml")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--aux-classes", default=PRETRAINING_CLASSES)
    ap.add_argument("--decoder-steps", type=int, default=2000)
    ap.add_argument("--held", type=int, default=500, help="test images for the known-pair scores")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--figure", default=None, help="Fig. 5-style reconstructions (PNG)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    common = [*args.overrides, "methods=[eftvit]", "sweep=[]", "eval_every=0"]
    cfg = load_config(args.config, [*common, f"method.eftvit.rounds={args.rounds}"])
    aux_cfg = load_config(args.config, [*common, f"data.classes={args.aux_classes}"])
    aux = assembly.load_splits(aux_cfg).train.images.float() / 255

    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), cfg.seeds[0])
    job = assembly.build_job(cfg, "eftvit", ctx)
    method, run = job.method, ctx.run
    m, r = method.config.local_depth, method.config.mask_ratio
    vit = method.base_vit()
    grid, patch = vit.patch_embed.grid_size, vit.patch_embed.patch_size
    to_input = run.eval_transform
    pretrained, _ = method.base.build().split(m)
    pretrained.eval()
    kw = dict(embed_dim=vit.embed_dim, grid=grid, patch=patch, to_input=to_input)
    decoders = {
        name: train_feature_decoder(
            pretrained, aux, cfg=DecoderConfig(mask_ratio=ratio, steps=args.decoder_steps), **kw
        )
        for name, ratio in (("masked", r), ("unmasked", 0.0))
    }

    own = [ctx.splits.train.subset(list(idx)) for idx in ctx.federation.client_indices]
    client_images = {c: (d.images.float() / 255, d.labels) for c, d in enumerate(own)}
    inverter = UploadInverter(decoders["masked"], client_images)
    result = SimulationRuntime().execute(job, observers=[inverter])
    upload_curve = [{"round": t, **pairs_mean(s)} for t, s in sorted(inverter.scores.items())]

    held = ctx.splits.test.images[: args.held].float() / 255
    floor = held.mean(0, keepdim=True).expand_as(held)
    trivial = {"psnr": float(psnr(floor, held).mean()), "ssim": float(ssim(floor, held).mean())}
    encoders = {"pretrained": pretrained}
    sent = {n: result.state.global_module[n] for n in method.names().sent}
    for c, state in sorted(result.client_states.items()):
        if state.tensors:  # a client never sampled still has the pretrained module
            encoders[f"client {c}"] = method.client_net(sent, state).bottom.eval()
    known: dict[str, dict[str, dict[str, float]]] = {}
    for name, ratio in (("masked", r), ("unmasked", 0.0)):
        curve = inversion_curve(
            decoders[name],
            dict(enumerate(encoders.values())),
            held,
            num_patches=vit.num_patches,
            mask_ratio=ratio,
            to_input=to_input,
        )
        known[name] = {
            enc: {"psnr": p["psnr"], "ssim": p["ssim"]}
            for enc, p in zip(encoders, curve, strict=True)
        }

    if args.figure:
        drifted_name = min(
            (k for k in known["unmasked"] if k != "pretrained"),
            key=lambda k: known["unmasked"][k]["psnr"],
            default="pretrained",
        )
        rows = {
            "original": None,
            f"masked, r={r}": (decoders["masked"], pretrained, r),
            "unmasked": (decoders["unmasked"], pretrained, 0.0),
            f"unmasked, {drifted_name}": (decoders["unmasked"], encoders[drifted_name], 0.0),
        }
        save_figure(args.figure, held[:8], rows, vit.num_patches, to_input)

    epochs = method.run.train.epochs
    exposure = {
        c: histogram_exposure(d.class_counts(), epochs, method.config.threshold_quantile)
        for c, d in enumerate(own)
    }
    out = {
        "accuracy": result.metrics.get("global_test_accuracy"),
        "upload_curve": upload_curve,
        "known_pairs": known,
        "trivial_mean_image": trivial,
        "histograms": exposure,
    }
    print(f"server accuracy {100 * (out['accuracy'] or 0):.1f} %")
    print(
        f"mean test image (trivial guess): PSNR {trivial['psnr']:.2f} dB, SSIM {trivial['ssim']:.3f}"
    )
    print("uploads inverted by round (masked decoder, min-MSE pairing): round PSNR SSIM")
    for p in upload_curve:
        print(f"  {p['round']:>3} {p['psnr']:6.2f} {p['ssim']:.3f}")
    print("known pairs on held-out test images: encoder | masked PSNR/SSIM | unmasked PSNR/SSIM")
    for enc in encoders:
        a, b = known["masked"][enc], known["unmasked"][enc]
        print(f"  {enc:<12} {a['psnr']:6.2f} {a['ssim']:.3f} | {b['psnr']:6.2f} {b['ssim']:.3f}")
    drifted = [k for k in encoders if k != "pretrained"]
    for name in ("masked", "unmasked"):
        vals = [known[name][k]["psnr"] for k in drifted]
        print(f"  clients' final modules, {name}: mean PSNR {statistics.mean(vals):.2f} dB")
    tv = [e["tv_after"] for e in exposure.values()]
    disclosed = sum(e["support_disclosed"] for e in exposure.values())
    print(
        f"label histograms: TV to the true distribution 0 with one feature per image, "
        f"{statistics.mean(tv):.3f} (range {min(tv):.3f}-{max(tv):.3f}) after median sampling; "
        f"class set disclosed for {disclosed}/{len(tv)} clients"
    )
    for c, e in exposure.items():
        print(f"  client {c}: true {e['before']} -> uploaded {e['after']} (TV {e['tv_after']:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
