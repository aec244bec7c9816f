"""Cost of the FL schemes' objective terms and of the DP defence, per local step.

SCAFFOLD, FedDyn and FedDC differ from FedAvg only in objective terms
(``osfl.fl.objectives``) run by the same training engine; this measures what
those hooks add to a local step (median of ``--repeats`` runs of ``--steps``
steps of ``train_local``), and what clipping + noising an upload costs
(``osfl.privacy.defenses.clip_and_noise``), on CPU with one torch thread. Times
are CPU time of the process (``time.process_time``), so that other jobs on a
shared machine inflate them less than wall time.

    python benchmarks/bench_schemes.py [--steps 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.objectives import FedDCTerm, FedDynTerm, ProximalTerm, ScaffoldCorrection
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.models import create_model
from osfl.privacy.defenses import clip_and_noise

MODELS = {
    "cnn_small 16px": ("cnn_small", {"in_chans": 1, "img_size": 16}, (1, 16, 16)),
    "lenet5 32px": ("lenet5", {"img_size": 32}, (3, 32, 32)),
}


def _terms(name: str, model: torch.nn.Module) -> tuple:
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    small = {k: 0.01 * torch.ones_like(v) for k, v in params.items()}
    return {
        "fedavg": (),
        "fedprox": (ProximalTerm(params, 0.01),),
        "scaffold": (ScaffoldCorrection(small, small),),
        "feddyn": (FedDynTerm(params, small, 0.01),),
        "feddc": (FedDCTerm(params, small, small, 0.01),),
    }[name]


def time_training(model_key: str, scheme: str, optimizer: str, steps: int, repeats: int) -> float:
    name, kwargs, shape = MODELS[model_key]
    g = torch.Generator().manual_seed(0)
    n = 64 * 4
    data = ImageSet(
        torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g),
        torch.arange(n) % 10,
        tuple(str(i) for i in range(10)),
    )
    cfg = TrainConfig(steps=steps, batch_size=64, lr=0.01, optimizer=optimizer)
    times = []
    for _ in range(repeats):
        torch.manual_seed(0)
        model = create_model(name, num_classes=10, **kwargs)
        terms = _terms(scheme, model)
        t = time.process_time()
        train_local(model, data, cfg, terms=terms, generator=torch.Generator().manual_seed(1))
        times.append(time.process_time() - t)
    return statistics.median(times) / steps * 1e3


def time_defense(model_key: str, repeats: int) -> float:
    name, kwargs, _ = MODELS[model_key]
    model = create_model(name, num_classes=10, **kwargs)
    update = {k: 0.01 * torch.randn_like(p) for k, p in model.named_parameters()}
    times = []
    for r in range(repeats):
        t = time.process_time()
        clip_and_noise(update, clip=1.0, sigma=0.05, generator=torch.Generator().manual_seed(r))
        times.append(time.process_time() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    schemes = ["fedavg", "fedprox", "scaffold", "feddyn", "feddc"]
    print(
        f"CPU ms per local step (batch 64, median of {args.repeats} x {args.steps} steps, 1 thread)"
    )
    for model_key in MODELS:
        for opt in ("sgd", "sgdm"):
            base = None
            cells = []
            for s in schemes:
                ms = time_training(model_key, s, opt, args.steps, args.repeats)
                base = base or ms
                cells.append(f"{s} {ms:6.2f} ({ms / base:4.2f}x)")
            print(f"{model_key:15s} {opt:5s} " + "  ".join(cells))
    print("clip + noise of one upload (CPU ms):")
    for model_key in MODELS:
        print(f"  {model_key:15s} {time_defense(model_key, args.repeats):.2f}")


if __name__ == "__main__":
    main()
