"""SCAFFOLD, FedDyn, FedDC's shared helpers: a tiny model and data for the
objective terms, a run on 16-px digits and a simulation of one scheme
(tests/methods/schemes/)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.fl.context import ModelSpec, RunContext
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.fl.upload import Upload
from osfl.methods.schemes import SchemeState


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.Tanh(), nn.Linear(5, 3))


def tiny_data(n: int = 12) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8, generator=g)
    return ImageSet(images=images, labels=torch.arange(n) % 3, classes=("a", "b", "c"))


def named(model: nn.Module, fill: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(p, fill) for k, p in model.named_parameters()}


def one_full_batch_step(model: nn.Module, terms, **cfg) -> None:
    cfg = {"steps": 1, "batch_size": 12, "lr": 0.5, "optimizer": "sgd", **cfg}
    train_local(model, tiny_data(), TrainConfig(**cfg), terms=terms)


def ce_grad(model: nn.Module) -> dict[str, torch.Tensor]:
    data = tiny_data()
    model.zero_grad()
    F.cross_entropy(model(data.images.float() / 255), data.labels).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def make_run(train: ImageSet, num_clients: int, **train_cfg: Any) -> RunContext:
    from osfl.data.transforms import build_transform

    cfg = {"epochs": 1, "batch_size": 16, "lr": 0.05, "optimizer": "sgd", **train_cfg}
    tf = build_transform("none", image_size=16, mean=(0.5,), std=(0.5,))
    return RunContext(
        num_classes=10,
        image_shape=train.image_shape,
        num_clients=num_clients,
        model=ModelSpec("cnn_small", {"in_chans": 1, "img_size": 16}),
        train=TrainConfig(**cfg),
        train_transform=tf,
        eval_transform=tf,
        seed=0,
    )


def simulate(name: str, options: dict, train: ImageSet, fed: Any, run: RunContext, test=None):
    from osfl.config import method_config
    from osfl.fl.evaluate import evaluate

    cls = METHODS.get(name)
    method = cls(method_config(cls, options), run)
    evaluator = None
    if test is not None:

        def evaluator(pred):
            return evaluate(pred, test, run.eval_transform, run.device).as_dict()

    result = run_simulation(method, run, train, fed, evaluator=evaluator)
    return method, result


def fake_uploads(method, state: SchemeState, deltas: dict[int, float], n: dict[int, int]):
    names = method.param_names()
    ups = {}
    for c, d in deltas.items():
        t = {k: v.clone() for k, v in state.model.items()}
        for k in names:
            t[k] = t[k] + d
        ups[c] = Upload(tensors=t, meta={"num_samples": n[c]})
    return ups
