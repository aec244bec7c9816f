"""End to end: ``fafi`` on scikit-learn's digits beats chance by a wide margin."""

from __future__ import annotations

from osfl.assembly import build_federation, build_run, load_splits
from osfl.config import load_config
from osfl.fl.evaluate import evaluate
from osfl.fl.runtime.simulation import run_simulation
from osfl.methods.fafi import FAFI, FAFIConfig
from support.tiny import TINY_FAFI_E2E


def test_fafi_on_digits_beats_chance_by_far() -> None:
    """Five clients under Dir(0.5), native 8 px digits, 6 local epochs of SALT.

    Chance is 10 %; FAFI reaches ~0.8 here (0.78 after 4 epochs, 0.86 after 8).
    Horizontal flips are the augmentation: SimCLR's crops destroy 8 px digits.
    """
    cfg = load_config(
        None,
        [
            *TINY_FAFI_E2E,
            "train.epochs=6",
            "train.batch_size=32",
            "progress=false",
            "cache_dir=null",
            "threads_per_client=1",
        ],
    )
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    run = build_run(cfg, splits, fed, 0)
    method = FAFI(FAFIConfig(augment="flip"), run)
    res = run_simulation(method, run, splits.train, fed, threads_per_client=1)
    assert res.refused == [] and len(res.state["clients"]) == 5
    acc = evaluate(res.predictor, splits.test, run.eval_transform, "cpu").accuracy
    assert acc > 0.5, f"FAFI accuracy {acc:.3f} on digits"
