"""What FENS's INT8 departure costs: weight-only INT8 (what ``fens`` does)
against the authors' full static quantisation (``sacs-epfl/fens`` a349903,
``generate_logits_v2.py`` lines 123–142: ``default_qconfig``, INT8 weights and
7-bit affine activations calibrated by min/max), and against float32.

For each seed and α of a config it builds FENS's own clients (the cached
training share of each client, the same cache entries a ``fens`` run makes),
quantises each client model three ways, computes every client's held-out
logits and the test logits, and trains the aggregator with FENS's own steps
(:func:`~osfl.methods.fens.aggregator.train_aggregator`, the server's
FedAdam) for ``rounds`` rounds in-process: the same generators for the three
variants, so the differences are the quantisation's alone. The authors
calibrate on each client's share of the *test* set; here each client
calibrates on its own training share (the test set stays unseen). Eager-mode
static quantisation needs a model whose every op is quantisable (cnn_small
is; a ResNet's residual adds are not without rewriting it).

    python benchmarks/fens_activation_quant.py configs/scoreboard_scratch_cpu.yaml --out FILE.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.ao.quantization import QuantWrapper, convert, default_qconfig, prepare

from osfl import assembly
from osfl.config import load_config
from osfl.data.imageset import ImageSet
from osfl.fl.aggregators import weighted_mean
from osfl.fl.runtime.client import client_context
from osfl.fl.seeds import derive_seed
from osfl.fl.server_optim import server_step
from osfl.methods.clients import cpu_state, initial_state, trained_client
from osfl.methods.fens.aggregator import samples_seen, train_aggregator

Variant = Callable[[nn.Module, ImageSet], nn.Module]


def static_int8(model: nn.Module, calibration: torch.Tensor) -> nn.Module:
    """The authors' recipe: default_qconfig, prepare, min/max calibration, convert."""
    q = QuantWrapper(copy.deepcopy(model).cpu().eval())
    q.qconfig = default_qconfig
    prepare(q, inplace=True)
    with torch.no_grad():
        for i in range(0, len(calibration), 256):
            q(calibration[i : i + 256])
    return convert(q, inplace=True)


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x[i : i + 256]).float() for i in range(0, len(x), 256)])


def one_seed(cfg, splits, seed: int, rounds: int) -> dict[str, float]:
    ctx = assembly.seed_context(cfg, splits, seed)
    job = assembly.build_job(cfg, "fens", ctx)
    method, run = job.method, job.run
    transform = run.eval_transform or (lambda x: x.float() / 255)
    init = initial_state(run)
    members, helds, trains = [], [], []
    for c in range(run.num_clients):
        cctx = client_context(run, client=c, round=0, seed=seed)
        train, held = method.split(cctx, job.clients.data(c))
        model = trained_client(cctx, train, init).cpu().eval()
        members.append(model)
        helds.append(held)
        trains.append(transform(train.images))
    weight_only = [method.member_model(method_int8(method, m)).eval() for m in members]
    static = [static_int8(m, x) for m, x in zip(members, trains, strict=True)]
    test_x = transform(ctx.splits.test.images)
    out = {}
    for name, models in (
        ("float32", members),
        ("int8 weights", weight_only),
        ("int8 static", static),
    ):
        held_logits = [
            torch.stack([logits(m, transform(h.images)) for m in models], dim=1) for h in helds
        ]
        test_logits = torch.stack([logits(m, test_x) for m in models], dim=1)
        agg = fit_aggregator(method, held_logits, [h.labels for h in helds], rounds, seed)
        with torch.no_grad():
            pred = agg(test_logits).argmax(1)
        out[name] = round(100 * float((pred == ctx.splits.test.labels).float().mean()), 2)
    return out


def method_int8(method, model: nn.Module) -> dict[str, torch.Tensor]:
    from osfl.methods.fens.quantize import quantize_int8

    return quantize_int8(cpu_state(model), method.int8_keys)


def fit_aggregator(method, held_logits, labels, rounds: int, seed: int) -> nn.Module:
    """FENS's aggregator rounds in-process: every client's steps, the weighted
    mean, the server's FedAdam step."""
    cfg = method.config
    agg = method.new_aggregator(len(held_logits))
    x, slots = cpu_state(agg), None
    for r in range(1, rounds + 1):
        states, weights = [], []
        for c, (z, y) in enumerate(zip(held_logits, labels, strict=True)):
            agg.load_state_dict(x)
            gen = torch.Generator().manual_seed(derive_seed(seed, c, r, "fens-quant-bench"))
            train_aggregator(agg, z, y, cfg.local, gen)
            states.append(cpu_state(agg))
            weights.append(samples_seen(len(y), cfg.local))
        x, slots = server_step(cfg.server_opt, x, weighted_mean(states, weights), slots)
    agg.load_state_dict(x)
    return agg.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--rounds", type=int, default=None, help="default: method.fens.rounds")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the runs' threads_per_client: the same cache entries
    warnings.filterwarnings("ignore")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for alpha in ("0.1", "0.5"):
        cfg = load_config(args.config, [*args.overrides, f"partition.alpha={alpha}"])
        splits = assembly.load_splits(cfg)
        rounds = (
            args.rounds
            or assembly.build_job(
                cfg, "fens", assembly.seed_context(cfg, splits, cfg.seeds[0])
            ).method.config.rounds
        )
        for seed in cfg.seeds:
            res = one_seed(cfg, splits, seed, rounds)
            print(f"alpha={alpha} seed={seed}: {res}", flush=True)
            for name, acc in res.items():
                results.setdefault(f"{name}|alpha={alpha}", {})[str(seed)] = acc
    for key, per in results.items():
        v = list(per.values())
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"{key}: {statistics.mean(v):.2f} ± {sd:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
