"""Reproductions of Chen & Vikalo, "Recovering Labels from Local Updates in
Federated Learning" (ICML 2024): the shapes of Tables 2, 3, 4, 6, Figure 1
and the gradient-inversion comparison (§4.9), on osfl's attacks.

Usage (from the repository root; each subcommand reads one config):

    python benchmarks/repro_rlu.py table2 configs/rlu_table2_cpu.yaml
    python benchmarks/repro_rlu.py table3 configs/rlu_table3_cpu.yaml
    python benchmarks/repro_rlu.py table4 configs/rlu_table4_cpu.yaml
    python benchmarks/repro_rlu.py table6 configs/rlu_table6_cpu.yaml
    python benchmarks/repro_rlu.py fig1   configs/rlu_fig1_cpu.yaml
    python benchmarks/repro_rlu.py inversion configs/rlu_inversion_cpu.yaml

Each prints a markdown table and writes ``runs/repro_rlu/<name>.json``
(rewritten after every setting, so a long run leaves partial results).
``key=value`` arguments after the config override it (OmegaConf dotlist).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from osfl.fl.evaluate import evaluate
from osfl.methods.clients import ModelPredictor
from rlu_common import (
    Setup,
    attack_observation,
    build_model,
    fmt,
    make_clients,
    observe,
    scheme_rounds,
)

log = logging.getLogger("repro_rlu")


def _save(cfg: Any, name: str, payload: dict[str, Any]) -> None:
    out = Path(cfg.get("out_dir", "runs/repro_rlu"))
    out.mkdir(parents=True, exist_ok=True)
    doc = {"config": OmegaConf.to_container(cfg, resolve=True), **payload}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2))


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return float(np.mean([r[key] for r in rows])) if rows else math.nan


def _attack_clients(setup: Setup, clients: list, cfg: Any) -> list[int]:
    n = cfg.get("attack_clients")
    ids = [i for i, c in enumerate(clients) if len(c) > 0]
    return ids if n is None else ids[: int(n)]


# ------------------------------------------------------------------ Table 2
def table2(cfg: Any) -> None:
    setup = Setup.from_config(cfg)
    clients = make_clients(
        setup.data.train, cfg.federation.num_clients, cfg.federation.alpha, cfg.seed
    )
    attacks = list(cfg.attacks)
    results = []
    print("| model | act | B | m | " + " | ".join(f"{a} cAcc | {a} iAcc" for a in attacks) + " |")
    print("|---|---|---|---|" + "---|---|" * len(attacks))
    for s in cfg.settings:
        model = build_model(setup, s.model, s.act, cfg.seed)
        for m in cfg.steps:
            t0 = time.perf_counter()
            per = {a: [] for a in attacks}
            for c in _attack_clients(setup, clients, cfg):
                obs, _ = observe(setup, model, clients[c], s, steps=m, lr=cfg.lr, client=c)
                for a, sc in attack_observation(setup, obs, attacks, cfg).items():
                    per[a].append(sc)
            row = {"model": s.model, "act": s.act, "batch_size": s.batch_size, "steps": m,
                   "seconds": time.perf_counter() - t0,
                   **{a: {"cAcc": _mean(v, "cAcc"), "iAcc": _mean(v, "iAcc"), "n": len(v)} for a, v in per.items()}}  # fmt: skip
            results.append(row)
            cells = " | ".join(f"{fmt(row[a]['cAcc'])} | {fmt(row[a]['iAcc'])}" for a in attacks)
            print(f"| {s.model} | {s.act} | {s.batch_size} | {m} | {cells} |", flush=True)
            _save(cfg, "table2", {"rows": results})


# ------------------------------------------------------------------ Table 3
def table3(cfg: Any) -> None:
    setup = Setup.from_config(cfg)
    attacks = list(cfg.attacks)
    s = cfg.setting
    model = build_model(setup, s.model, s.act, cfg.seed)
    rows = []
    print("| alpha | " + " | ".join(attacks) + " |  (iAcc)")
    print("|---|" + "---|" * len(attacks))
    for alpha in cfg.alphas:
        clients = make_clients(setup.data.train, cfg.federation.num_clients, alpha, cfg.seed)
        per = {a: [] for a in attacks}
        for c in _attack_clients(setup, clients, cfg):
            obs, _ = observe(setup, model, clients[c], s, steps=cfg.steps, lr=cfg.lr, client=c)
            for a, sc in attack_observation(setup, obs, attacks, cfg).items():
                per[a].append(sc)
        row = {"alpha": alpha, **{a: _mean(v, "iAcc") for a, v in per.items()}}
        rows.append(row)
        print(f"| {alpha} | " + " | ".join(fmt(row[a]) for a in attacks) + " |", flush=True)
        _save(cfg, "table3", {"rows": rows})


# ------------------------------------------------------------------ Table 4
def table4(cfg: Any) -> None:
    setup = Setup.from_config(cfg)
    clients = make_clients(
        setup.data.train, cfg.federation.num_clients, cfg.federation.alpha, cfg.seed
    )
    attacks = list(cfg.attacks)
    rows = []
    print("| scheme | hyper-parameters | " + " | ".join(attacks) + " |  (iAcc)")
    print("|---|---|" + "---|" * len(attacks))
    for sch in cfg.schemes:
        model = build_model(setup, cfg.setting.model, cfg.setting.act, cfg.seed)
        obs_list = scheme_rounds(
            setup, model, clients, cfg, sch, _attack_clients(setup, clients, cfg)
        )
        per = {a: [] for a in attacks}
        for obs in obs_list:
            for a, sc in attack_observation(setup, obs, attacks, cfg).items():
                per[a].append(sc)
        params = {k: v for k, v in OmegaConf.to_container(sch).items() if k not in ("name",)}
        row = {
            "scheme": sch.name,
            "params": params,
            **{a: _mean(v, "iAcc") for a, v in per.items()},
        }
        rows.append(row)
        label = ", ".join(f"{k}={v}" for k, v in params.items())
        print(
            f"| {sch.name} | {label} | " + " | ".join(fmt(row[a]) for a in attacks) + " |",
            flush=True,
        )
        _save(cfg, "table4", {"rows": rows})


# ------------------------------------------------------------------ Table 6
def table6(cfg: Any) -> None:
    from osfl.privacy.defenses import clip_and_noise

    setup = Setup.from_config(cfg)
    clients = make_clients(
        setup.data.train, cfg.federation.num_clients, cfg.federation.alpha, cfg.seed
    )
    s = cfg.setting
    model = build_model(setup, s.model, s.act, cfg.seed)
    rows = []
    print("| m | " + " | ".join(f"sigma={x}" for x in cfg.sigmas) + " |  (RLU iAcc)")
    print("|---|" + "---|" * len(cfg.sigmas))
    for m in cfg.steps:
        row: dict[str, Any] = {"steps": m}
        for sigma in cfg.sigmas:
            scores = []
            for c in _attack_clients(setup, clients, cfg):
                # σ as in DP-SGD [Abadi et al. 2016]: N(0, σ²) on each step's *summed* batch
                # gradient, i.e. σ/|B| on the mean gradient; over m SGD steps the update
                # −η Σ_τ g_τ then carries noise of std σ η √m / |B|, added once here with
                # the defence's own clip_and_noise (no clipping, as in Table 6)
                std = sigma * cfg.lr * math.sqrt(m) / int(s.batch_size)
                gen = torch.Generator().manual_seed(int(cfg.seed) + 1000 * c + m)

                def hook(d: dict, std: float = std, gen: torch.Generator = gen) -> dict:
                    return clip_and_noise(d, clip=None, sigma=std, generator=gen)[0]

                obs, _ = observe(
                    setup, model, clients[c], s, steps=m, lr=cfg.lr, client=c, hook=hook
                )
                scores.append(attack_observation(setup, obs, ["rlu"], cfg)["rlu"])
            row[str(sigma)] = _mean(scores, "iAcc")
        rows.append(row)
        print(f"| {m} | " + " | ".join(fmt(row[str(x)]) for x in cfg.sigmas) + " |", flush=True)
        _save(cfg, "table6", {"rows": rows})


# ------------------------------------------------------------------ Figure 1
def fig1(cfg: Any) -> None:
    from osfl.fl.train_config import TrainConfig
    from scheme_driver import drive, make_run

    setup = Setup.from_config(cfg)
    clients = make_clients(
        setup.data.train, cfg.federation.num_clients, cfg.federation.alpha, cfg.seed
    )
    attacks = list(cfg.attacks)
    s = cfg.setting
    eval_rounds = set(cfg.eval_rounds)
    train = TrainConfig(steps=int(cfg.steps), batch_size=int(s.batch_size), lr=float(cfg.lr),
                        optimizer="sgd", drop_last=False, amp=False)  # fmt: skip
    run = make_run(setup, s.model, s.act, train, len(clients), int(cfg.seed))
    model = build_model(setup, s.model, s.act, cfg.seed)
    per: dict[int, dict[str, list]] = {r: {a: [] for a in attacks} for r in eval_rounds}
    acc: dict[int, float] = {}
    rows: list[dict[str, Any]] = []
    print("| round | train acc | " + " | ".join(attacks) + " |  (iAcc)")
    print("|---|---|" + "---|" * len(attacks))

    def report(r: int) -> None:
        row = {"round": r, "train_acc": acc[r], **{a: _mean(v, "iAcc") for a, v in per[r].items()}}
        rows.append(row)
        print(
            f"| {r} | {fmt(acc[r])} | " + " | ".join(fmt(row[a]) for a in attacks) + " |",
            flush=True,
        )
        _save(cfg, "fig1", {"rows": rows})

    def on_round_start(r: int, state: dict) -> None:
        if r - 1 in eval_rounds:
            report(r - 1)
        if r in eval_rounds:
            model.load_state_dict(state)
            acc[r] = evaluate(
                ModelPredictor(model), setup.train_eval, setup.transform, setup.device
            ).accuracy

    def watch(r: int, c: int, obs: Any) -> None:
        for a, sc in attack_observation(setup, obs, attacks, cfg).items():
            per[r][a].append(sc)

    drive("fedavg", {}, run, clients, int(cfg.rounds),
          init_state={k: v.detach().clone() for k, v in model.state_dict().items()},
          watch=watch, watch_rounds=eval_rounds, watch_clients=set(_attack_clients(setup, clients, cfg)),
          on_round_start=on_round_start)  # fmt: skip
    if int(cfg.rounds) - 1 in eval_rounds:
        report(int(cfg.rounds) - 1)


# ------------------------------------------------------------------ gradient inversion
def inversion(cfg: Any) -> None:
    from osfl.privacy import run_attack
    from osfl.privacy.inversion import (
        InversionConfig,
        invert_gradients,
        match_and_score,
        update_to_gradient,
    )

    setup = Setup.from_config(cfg)
    s = cfg.setting
    icfg = InversionConfig(**OmegaConf.to_container(cfg.inversion))
    rows = []
    print("| batch | labels | label iAcc | PSNR | SSIM |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(cfg.seed)
    for b in range(cfg.batches):
        model = build_model(setup, s.model, s.act, cfg.seed + b)
        idx = rng.choice(len(setup.data.train), s.batch_size, replace=False)
        batch = setup.data.train.subset(idx)
        obs, _ = observe(setup, model, batch, s, steps=1, lr=cfg.lr, client=b)
        truth = obs.truth["labels"]
        target = update_to_gradient(model, obs.broadcast, obs.upload, cfg.lr, 1)
        rlu = run_attack(
            "rlu", obs, setup.aux, transform=setup.transform, **dict(cfg.get("rlu", {}))
        )
        images = batch.images.float() / 255
        for mode in cfg.modes:
            labels = {"given": truth, "rlu": torch.as_tensor(rlu.labels()), "joint": None}[mode]
            t0 = time.perf_counter()
            res = invert_gradients(model, target, tuple(images.shape), labels=labels,
                                   num_classes=setup.num_classes, mean=setup.mean, std=setup.std,
                                   config=icfg, device=setup.device)  # fmt: skip
            sc = match_and_score(res.images, images)
            lab = np.bincount(res.labels.numpy(), minlength=setup.num_classes)
            lab_acc = float(
                np.minimum(lab, np.bincount(truth.numpy(), minlength=setup.num_classes)).sum()
                / len(truth)
            )
            row = {"batch": b, "labels": mode, "label_iAcc": lab_acc, "psnr": sc["psnr"], "ssim": sc["ssim"],
                   "lpips": sc.get("lpips"), "seconds": time.perf_counter() - t0}  # fmt: skip
            rows.append(row)
            print(
                f"| {b} | {mode} | {fmt(lab_acc)} | {sc['psnr']:.2f} | {sc['ssim']:.3f} |",
                flush=True,
            )
            _save(cfg, "inversion", {"rows": rows})
    for mode in cfg.modes:
        sel = [r for r in rows if r["labels"] == mode]
        print(
            f"| mean | {mode} | {fmt(_mean(sel, 'label_iAcc'))} | {_mean(sel, 'psnr'):.2f} | {_mean(sel, 'ssim'):.3f} |"
        )


COMMANDS = {
    "table2": table2,
    "table3": table3,
    "table4": table4,
    "table6": table6,
    "fig1": fig1,
    "inversion": inversion,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="key=value (OmegaConf dotlist)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = OmegaConf.merge(OmegaConf.load(args.config), OmegaConf.from_dotlist(args.overrides))
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(int(cfg.get("threads", 1)))
    threadpool_limits(int(cfg.get("threads", 1)))  # numpy's BLAS (RLU's solves, Monte Carlo)
    t0 = time.perf_counter()
    COMMANDS[args.command](cfg)
    print(
        f"\n{args.command}: {time.perf_counter() - t0:.0f} s  ({args.config} {' '.join(args.overrides)})"
    )


if __name__ == "__main__":
    main()
