"""FAFI diagnostics: do the prototypes learn, what do IFFI's weights do, which inference wins.

For each seed of a FAFI config, trains (or finds in the client cache) the FAFI
clients of ``--method`` (``fafi`` or ``fafi_code``, options from the config plus
``--opt key=value``), then, from the *same* clients:

* prototypes: cosine of each client's trained prototypes to the common initial
  ones (rows of classes the client holds / does not hold), their norms, and the
  cosine between different clients' prototypes of one class;
* IFFI (Zeng et al., ICML 2025, Eq. 8): the per-client, per-test-sample weights
  ``alpha_m(x) = 1 - cos(F_m(x), F_m(eps))`` — their range, each client's mean and
  std over the test set, and the share of their variance that the client
  identity alone explains (1.0 = a constant weight per client); the mean cosine
  of a client's test features to their own mean (post-ReLU features are all
  alike);
* test accuracy of every inference from these clients: fusion ``iffi`` /
  ``average`` / ``data_size`` / ``iffi_const`` (each client weighted by its mean
  IFFI weight, constant over samples) x scoring ``cosine`` / ``unit_feature``.

    python benchmarks/fafi_analysis.py [--config configs/fafi_cifar10_cpu.yaml]
        [--method fafi] [--seeds 0 1 2] [--opt key=value ...] [--json OUT] [overrides ...]

Example (the REPRODUCTION.md numbers): ``python benchmarks/fafi_analysis.py
partition.alpha=0.1 cache_dir=/tmp/issue16/cache --json /tmp/issue16/fafi_a01.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
from typing import Any

import torch
import torch.nn.functional as F


def _parse_opt(text: str) -> tuple[str, Any]:
    import yaml

    key, _, value = text.partition("=")
    return key, yaml.safe_load(value)


def prototype_stats(method: Any, state: dict[str, Any], class_counts: Any) -> dict[str, Any]:
    """Cosine of trained to initial prototypes (held / not held classes), norms,
    and the mean cross-client cosine of one class's prototypes."""
    ids = sorted(state["clients"])
    init = state["init"][method.arch_of(ids[0])]["prototypes"].float()
    held, unheld, norms = [], [], []
    for c in ids:
        p = state["clients"][c]["prototypes"].float()
        cos = F.cosine_similarity(p, init, dim=1)
        has = torch.tensor([int(n) for n in class_counts[c]]) > 0
        held += cos[has].tolist()
        unheld += cos[~has].tolist()
        norms += p.norm(dim=1).tolist()
    stack = torch.stack(
        [F.normalize(state["clients"][c]["prototypes"].float(), dim=1) for c in ids]
    )
    cross = torch.einsum("mcd,ncd->cmn", stack, stack)
    m = len(ids)
    off = cross[:, ~torch.eye(m, dtype=torch.bool)]
    return {
        "cos_to_init_held": statistics.fmean(held) if held else None,
        "cos_to_init_held_min": min(held) if held else None,
        "cos_to_init_not_held": statistics.fmean(unheld) if unheld else None,
        "init_norm": float(init.norm(dim=1).mean()),
        "trained_norm": statistics.fmean(norms),
        "cross_client_cos": float(off.mean()) if m > 1 else None,
    }


def iffi_stats(predictor: Any, images: torch.Tensor, transform: Any) -> dict[str, Any]:
    """IFFI weights over the test set and how constant they are per client."""
    weights, self_cos = [], []
    predictor.eval()
    with torch.no_grad():
        for i in range(0, len(images), 500):
            x = transform(images[i : i + 500])
            predictor.fused_features(x)
            weights.append(predictor.last_weights.float())
            self_cos.append(predictor._features(x).float())
    w = torch.cat(weights, 1)  # M × N
    feats = torch.cat(self_cos, 1)  # M × N × D
    mean_feat = feats.mean(1, keepdim=True)
    cos_own_mean = F.cosine_similarity(feats, mean_feat, dim=-1).mean(1)
    total = float(w.var(unbiased=False))
    between = float(w.mean(1).var(unbiased=False))
    return {
        "min": float(w.min()),
        "max": float(w.max()),
        "client_mean": [round(float(v), 4) for v in w.mean(1)],
        "client_std": [round(float(v), 4) for v in w.std(1)],
        "share_of_variance_by_client": between / total if total > 0 else 1.0,
        "feature_cos_to_own_mean": [round(float(v), 4) for v in cos_own_mean],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/fafi_cifar10_cpu.yaml")
    p.add_argument("--method", default="fafi")
    p.add_argument("--seeds", type=int, nargs="*", default=None)
    p.add_argument("--opt", action="append", default=[], help="method option key=value")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    import osfl.methods  # noqa: F401
    from osfl.assembly import build_federation, build_run, load_splits, method_run
    from osfl.config import load_config, method_config
    from osfl.fl.evaluate import evaluate
    from osfl.fl.method import METHODS
    from osfl.fl.runtime.simulation import run_simulation
    from osfl.methods.fafi import IFFIPredictor

    cfg = load_config(args.config, ["sweep=[]", *args.overrides])
    splits = load_splits(cfg)
    cls = METHODS.get(args.method)
    opts = {**cfg.method.get(args.method, {}), **dict(_parse_opt(o) for o in args.opt)}
    base = method_config(cls, opts)
    out: dict[str, Any] = {"config": args.config, "method": args.method, "options": opts}
    seeds = args.seeds if args.seeds is not None else list(cfg.seeds)
    for seed in seeds:
        fed = build_federation(cfg, splits.train, seed)
        run = method_run(cfg, args.method, build_run(cfg, splits, fed, seed))  # its recipe
        method = cls(base, run)
        state = run_simulation(method, run, splits.train, fed, threads_per_client=1).state
        test, tf = splits.test, run.eval_transform

        def acc(pred: Any, test: Any = test, tf: Any = tf, run: Any = run) -> float:
            return round(100 * evaluate(pred, test, tf, run.device).accuracy, 2)

        row: dict[str, Any] = {"prototypes": prototype_stats(method, state, fed.class_counts)}
        iffi = cls(dataclasses.replace(base, fusion="iffi"), run).predictor(state)
        row["iffi_weights"] = iffi_stats(iffi, test.images, tf)
        accs: dict[str, float] = {}
        for scoring in ("cosine", "unit_feature"):
            for fusion in ("iffi", "average", "data_size"):
                m = cls(dataclasses.replace(base, fusion=fusion, scoring=scoring), run)
                accs[f"{fusion}/{scoring}"] = acc(m.predictor(state))
            ids = sorted(state["clients"])
            const = IFFIPredictor(
                [method.extractor_of(state, c) for c in ids],
                method.global_prototypes(state),
                fusion="data_size",
                client_weights=row["iffi_weights"]["client_mean"],
                scoring=scoring,
            )
            accs[f"iffi_const/{scoring}"] = acc(const)
        row["accuracy"] = accs
        out[f"seed{seed}"] = row
        print(f"seed {seed}: {json.dumps(row)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
