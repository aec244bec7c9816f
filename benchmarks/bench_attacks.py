"""Speed of the label-recovery attacks and of RLU's simplex least squares.

    python benchmarks/bench_attacks.py

Times ``run_attack`` on one Observation per setting (digits upsampled to
32 px, 3 channels, 10 classes, 20 auxiliary images per class, so nothing is
downloaded), reusing one ``resolve_inputs`` per Observation as an audit does;
"first" includes the auxiliary forward passes, "again" is a second call on the
same inputs (the forwards are memoised). Also times ``simplex_lstsq`` alone.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from osfl.data.sources import load_data
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import resolve_inputs, run_attack
from osfl.privacy.label_recovery.simplex_lsq import simplex_lstsq
from osfl.privacy.simulate import model_hparams, simulate_observation


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    # one BLAS thread too: on a shared machine more threads oversubscribe the
    # cores and slow numpy's small dense solves down by orders of magnitude
    threadpool_limits(1)
    d = load_data("digits", image_size=32, channels=3)
    y = d.test.labels.numpy()
    aux = d.test.subset(np.concatenate([np.flatnonzero(y == c)[:20] for c in range(10)]))
    print("attack timings (1 thread), seconds")
    print(
        f"{'model':8s} {'m':>3s} {'B':>3s} {'attack':7s} {'first':>7s} {'again':>7s} {'iAcc':>6s}"
    )
    for name, B in (("lenet5", 32), ("vgg16", 32)):
        for m in (1, 10):
            torch.manual_seed(0)
            model = create_model(name, num_classes=10)
            client = d.train.subset(
                np.random.default_rng(0).choice(len(d.train), 4 * B, replace=False)
            )
            cfg = TrainConfig(steps=m, batch_size=B, lr=0.01, drop_last=True, amp=False)
            obs, _ = simulate_observation(
                model, client, cfg, model_spec=model_hparams(name, {}, 10)
            )
            for attack in ("rlu", "llg+", "zlg+", "irlg"):
                inputs = resolve_inputs(obs)
                t1, res = _timed(lambda a=attack, x=inputs: run_attack(a, x, aux))
                t2, _ = _timed(lambda a=attack, x=inputs: run_attack(a, x, aux))
                iacc = res.score(obs.truth["labels"])["iAcc"]
                print(f"{name:8s} {m:3d} {B:3d} {attack:7s} {t1:7.3f} {t2:7.3f} {iacc:6.3f}")
    print("\nsimplex_lstsq (KKT on the NNLS support, FISTA fallback), median of 5")
    rng = np.random.default_rng(0)
    for k in (10, 100, 200):
        A = rng.normal(size=(k, k))
        u = A @ rng.dirichlet(np.ones(k))
        ts = [_timed(lambda A=A, u=u: simplex_lstsq(A, u))[0] for _ in range(5)]
        print(f"K={k:4d}: {np.median(ts) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
