"""FedMITR inversion label-hit rates: does a client's inversion get the label it was asked for?

Shen et al., FedMITR, Algorithm 1 lines 5-11: every client inverts a batch of
*uniformly* drawn labels. This script trains (or finds in the client cache) the
clients of a FedMITR config, then, per inversion setting, lets every client
invert ``--batch`` uniform labels with FedMITR's sparse inversion (the FedAvg of
the clients as the JS competitor, as at the first server epoch) and reports:

* ``own_hit``: share of a client's inversions that the client itself classifies
  (dense forward of the final image) as the target label, over the labels it
  holds (at least one training image);
* ``foreign_hit``: the same over the labels it holds no image of;
* ``foreign_share``: share of the pool's (client, label) pairs whose label the
  inverting client does not hold (Alg. 1 with uniform labels);
* ``ensemble_hit``: share of all inversions the client ensemble (the relabel
  teacher) classifies as the target label;
* ``kept_hit``: own-label hits of the sparse forward on the kept patches (what
  L_CLS trains the server on).

Settings are ``name:key=value,key=value`` over ``method.fedmitr`` options
(``inversion.*`` and FedMITR's own, e.g. ``jitter_per_patch``); the default set is
the cpu config, 300 iterations, and no / 1-pixel jitter.

    python benchmarks/fedmitr_label_hits.py [--config configs/fedmitr_cifar10_cpu.yaml]
        [--seeds 0 1 2] [--batch 64] [--setting NAME:k=v,...] [--json OUT] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from typing import Any

import torch

DEFAULT_SETTINGS = (
    "cpu:",
    "iters300:inversion.iterations=300",
    "no_jitter:inversion.jitter=0",
    "jitter1:inversion.jitter=1",
)


def _setting(text: str) -> tuple[str, dict[str, Any]]:
    import yaml

    name, _, body = text.partition(":")
    opts: dict[str, Any] = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        node = opts
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return name, opts


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def hits_for(
    method: Any, clients: list[torch.nn.Module], student: torch.nn.Module, held: Any, batch: int
) -> dict[str, float]:
    """One inversion batch per client under ``method``'s config; hit rates."""
    from osfl.methods.fedmitr import idx_from_keep_mask, invert_sparse, patch_grid
    from osfl.methods.kd import InputSpace
    from osfl.methods.kd.pixels import random_labels

    cfg, run = method.config, method.run
    grid = patch_grid(student)
    inv = cfg.inversion_for(min(grid[2], grid[3]))
    schedule = cfg.schedule_()
    space = InputSpace.from_transform(run.eval_transform, run.image_shape[0])
    gen = torch.Generator().manual_seed(run.seed)
    own, foreign, ens, kept, n_foreign, n_all = [], [], [], [], 0, 0
    for c, client in enumerate(clients):
        labels = random_labels(batch, run.num_classes, gen)
        res = invert_sparse(
            client,
            labels,
            run.image_shape,
            inv,
            schedule,
            student=student if inv.js_weight > 0 else None,
            space=space,
            generator=gen,
            device="cpu",
            stopped_pixels=cfg.stopped_pixels,
        )
        with torch.no_grad():
            x = res.images
            hit = client(x).argmax(1) == labels
            votes = torch.stack([m(x).softmax(1) for m in clients]).mean(0)
            ens += (votes.argmax(1) == labels).tolist()
            hi = idx_from_keep_mask(res.keep_mask)
            khit = client(x, keep_idx=hi).argmax(1) == labels
        has = torch.tensor([int(held[c][int(y)]) > 0 for y in labels])
        own += hit[has].tolist()
        kept += khit[has].tolist()
        foreign += hit[~has].tolist()
        n_foreign += int((~has).sum())
        n_all += batch

    def rate(v: list[bool]) -> float | None:
        return round(100 * statistics.fmean(v), 1) if v else None

    return {
        "own_hit": rate(own),
        "foreign_hit": rate(foreign),
        "foreign_share": round(100 * n_foreign / n_all, 1),
        "ensemble_hit": rate(ens),
        "kept_hit": rate(kept),
        "jitter_px": inv.jitter,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/fedmitr_cifar10_cpu.yaml")
    p.add_argument("--seeds", type=int, nargs="*", default=None)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--setting", action="append", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    import osfl.methods  # noqa: F401
    from osfl.assembly import build_federation, build_run, load_splits
    from osfl.config import load_config, method_config
    from osfl.fl.method import METHODS
    from osfl.fl.runtime.simulation import run_simulation
    from osfl.methods.clients import WEIGHTINGS, average_states, model_from_state

    cfg = load_config(args.config, ["sweep=[]", *args.overrides])
    splits = load_splits(cfg)
    base = dict(cfg.method.get("fedmitr", {}))
    settings = [_setting(s) for s in (args.setting or DEFAULT_SETTINGS)]
    seeds = args.seeds if args.seeds is not None else list(cfg.seeds)
    out: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "results": {}}
    for seed in seeds:
        fed = build_federation(cfg, splits.train, seed)
        run = build_run(cfg, splits, fed, seed)
        ens_cls = METHODS.get("ensemble")
        ens = ens_cls(method_config(ens_cls, {}), run)
        state = run_simulation(ens, run, splits.train, fed, threads_per_client=1).state
        ids, clients = ens.client_models(state)
        clients = [m.eval() for m in clients]
        counts = [state["num_samples"][c] for c in ids]
        avg = average_states(
            [state["clients"][c] for c in ids], WEIGHTINGS.get("data_size")(counts)
        )
        student = model_from_state(run, avg).eval()
        for p_ in [*student.parameters(), *(q for m in clients for q in m.parameters())]:
            p_.requires_grad_(False)
        held = [fed.class_counts[c] for c in ids]
        for name, extra in settings:
            fm_cls = METHODS.get("fedmitr")
            method = fm_cls(method_config(fm_cls, _merge(base, extra)), run)
            row = hits_for(method, clients, student, held, args.batch)
            out["results"].setdefault(name, {})[f"seed{seed}"] = row
            print(f"seed {seed} {name}: {json.dumps(row)}", flush=True)
    for name, per_seed in out["results"].items():
        keys = ("own_hit", "foreign_hit", "foreign_share", "ensemble_hit", "kept_hit")
        summary = {}
        for k in keys:
            vals = [r[k] for r in per_seed.values() if r[k] is not None]
            summary[k] = round(statistics.fmean(vals), 1) if vals else None
        per_seed["mean"] = summary
        print(f"mean {name}: {json.dumps(summary)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
