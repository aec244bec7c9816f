"""FedMITR Fig. 6: synthetic images with their high- and low-density patches.

Runs FedMITR's server (sparse inversion + token relabel) from the cached
clients of a config (default: configs/fedmitr_cifar10_cpu.yaml at alpha=0.1)
and draws, per column, one synthetic image: row 1 real training images of the
same classes, row 2 the whole synthetic image, row 3 its kept ("high
information density") patches, row 4 its stopped ("low density") patches.

    python benchmarks/fedmitr_fig6.py [--config PATH] [--out docs/img/fedmitr_fig6.png]
        [key=value ...]
"""

from __future__ import annotations

import argparse
import logging

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/fedmitr_cifar10_cpu.yaml")
    p.add_argument("--out", default="docs/img/fedmitr_fig6.png")
    p.add_argument("--n", type=int, default=8, help="images (columns)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import osfl.methods  # noqa: F401
    from osfl.assembly import build_federation, build_run, load_splits
    from osfl.config import load_config, method_config
    from osfl.fl.method import METHODS
    from osfl.fl.runtime.simulation import run_simulation
    from osfl.methods.fedmitr import patch_grid, pixel_mask
    from osfl.methods.kd import InputSpace

    cfg = load_config(args.config, list(args.overrides))
    seed = cfg.seeds[0]
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, seed)
    ctx = build_run(cfg, splits, fed, seed)
    cls = METHODS.get("fedmitr")
    opts = {**cfg.method.get("fedmitr", {}), "epochs": 1, "count_flops": False}
    method = cls(method_config(cls, opts), ctx)
    res = run_simulation(method, ctx, splits.train, fed)
    pool = method.artifacts(res.state)
    space = InputSpace.from_transform(ctx.eval_transform, ctx.image_shape[0])
    n = args.n
    x, y, keep = pool["pool_images"][:n], pool["pool_labels"][:n], pool["pool_keep"][:n]
    grid = patch_grid(method.run.model.build(ctx.num_classes))
    hi = pixel_mask(keep, grid)
    imgs = space.denormalize(x).clamp(0, 1)
    grey = torch.full_like(imgs, 0.5)
    rows = [
        ("real", None),
        ("synthetic", imgs),
        ("high density", imgs * hi + grey * (1 - hi)),
        ("low density", imgs * (1 - hi) + grey * hi),
    ]
    real_idx = [int((splits.train.labels == int(c)).nonzero()[0]) for c in y]
    real = splits.train.images[real_idx].float() / 255
    fig, axes = plt.subplots(len(rows), len(y), figsize=(1.3 * len(y), 1.4 * len(rows)))
    for r, (name, batch) in enumerate(rows):
        src = real if batch is None else batch
        for c in range(len(y)):
            ax = axes[r, c]
            img = src[c].permute(1, 2, 0).squeeze(-1).numpy()
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name, fontsize=8)
            if r == 0:
                ax.set_title(splits.train.classes[int(y[c])], fontsize=8)
    fig.suptitle("FedMITR synthetic data: kept (high) / stopped (low density) patches", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: {int(keep[0].sum())}/{keep.shape[1]} patches kept per image")


if __name__ == "__main__":
    main()
