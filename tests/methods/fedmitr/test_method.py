"""FedMITR end to end on digits (tiny ViT clients), its config checks and pretrained init."""

from __future__ import annotations

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.assembly import build_federation, build_run, load_splits
from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.fl.evaluate import evaluate
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from support.tiny import TINY_FEDMITR


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("fedmitr-cache")
    cfg = load_config(None, [*TINY_FEDMITR, f"cache_dir={cache}"])
    splits = load_splits(cfg)
    return cfg, splits, build_federation(cfg, splits.train, 0)


def make(setup, name: str, **options: object):
    cfg, splits, fed = setup
    ctx = build_run(cfg, splits, fed, 0)
    cls = METHODS.get(name)
    return cls(method_config(cls, options), ctx), ctx


def test_fedmitr_on_digits_beats_chance_and_fedavg(setup) -> None:
    _, splits, fed = setup
    accs = {}
    opts = {
        "epochs": 4,
        "synthesis_batch_size": 32,
        "inversion": {"iterations": 20, "lr": 0.1},
        "distill": {"batch_size": 32, "optimizer": "adam", "lr": 1e-3},
    }
    for name, kw in (("fedavg", {}), ("fedmitr", opts)):
        method, ctx = make(setup, name, **kw)
        res = run_simulation(method, ctx, splits.train, fed)
        accs[name] = evaluate(res.predictor, splits.test, ctx.eval_transform, "cpu").accuracy
    assert accs["fedmitr"] > 0.2  # chance is 0.1
    assert accs["fedmitr"] > accs["fedavg"]
    assert set(method.report(res.state)["phases"]["seconds"]) == {"synthesis", "distillation"}
    pool = method.artifacts(res.state)
    assert len(pool["pool_images"]) == len(pool["pool_labels"]) == 4 * 3 * 32  # T x M x batch
    # 16 patches, stops at 2, 4, 8, 12 of 20 iterations: 16 -> 12 -> 9 -> 7 -> 5 kept
    assert pool["pool_keep"].sum(1).unique().tolist() == [5]


def test_fedmitr_config_checks() -> None:
    cls = METHODS.get("fedmitr")
    cfg = method_config(cls, {})
    inv, d = cfg.inversion, cfg.distill
    assert (inv.iterations, inv.lr, inv.beta1, inv.beta2) == (100, 1e-3, 0.5, 0.99)
    assert (inv.tv_l2_weight, cfg.mask_ratio, cfg.lambda1, cfg.lambda2) == (1e-4, 0.3, 0.5, 0.5)
    assert (cfg.synthesis_batch_size, d.lr, d.momentum, d.weight_decay) == (64, 1e-3, 0.9, 1e-4)
    assert inv.js_weight == 1.0 and inv.keep == "last" and d.optimizer == "sgdm"
    assert method_config(cls, {"stop_at": [0.25, 0.5]}).stop_at == (0.25, 0.5)
    for bad in (
        {"augment": "crop_flip"},
        {"variant": "nope"},
        {"low_density_input": "x"},
        {"mask_ratio": 1.5},
        {"lambda1": -1.0},
        {"inversion": {"bn_weight": 1.0}},
        {"jitter_per_patch": -0.5},
        {"kept_count": "most"},
        {"stopped_pixels": "thawed"},
    ):
        with pytest.raises(ConfigError):
            method_config(cls, bad)


def test_pretrained_checkpoint_becomes_the_clients_init(setup, tmp_path) -> None:
    from safetensors.torch import save_file

    from osfl.models import create_model

    torch.manual_seed(123)
    ref = create_model(
        "vit_tiny_patch2_16",
        num_classes=10,
        img_size=8,
        in_chans=1,
        depth=1,
        embed_dim=32,
        num_heads=2,
    )
    path = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    method, _ = make(setup, "fedmitr", pretrained=str(path))
    init = method.init_state()["init"]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(init[k], v)
    plain, _ = make(setup, "fedmitr")
    assert not torch.equal(plain.init_state()["init"]["pos_embed"], ref.pos_embed.detach())
