"""The weight-averaging family's examples small enough to work out by hand:
one or two full-batch SGD steps of a small CNN on 24 digits at learning rate
``LR`` (tests/methods/fedavg/test_mechanisms.py, tests/methods/schemes/)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from osfl.config import method_config
from osfl.data.imageset import ImageSet
from osfl.data.transforms import build_transform
from osfl.fl.context import ClientContext, ClientState, ModelSpec, RunContext
from osfl.fl.method import METHODS
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import Upload
from osfl.methods.clients import model_from_state

LR = 0.1


def hand_run(num_clients: int = 4, **train: Any) -> RunContext:
    cfg = {"epochs": 1, "batch_size": 64, "lr": LR, "optimizer": "sgd", **train}
    tf = build_transform("none", image_size=16, mean=(0.5,), std=(0.5,))
    return RunContext(
        num_classes=10,
        image_shape=(1, 16, 16),
        num_clients=num_clients,
        model=ModelSpec("cnn_small", {"in_chans": 1, "img_size": 16}),
        train=TrainConfig(**cfg),
        train_transform=tf,
        eval_transform=tf,
        seed=0,
    )


def make(name: str, run: RunContext, **options: Any) -> Any:
    cls = METHODS.get(name)
    return cls(method_config(cls, options), run)


def ctx(run: RunContext, state: ClientState | None = None, client: int = 0) -> ClientContext:
    return ClientContext(run, client, 0, torch.Generator().manual_seed(0), state or ClientState())


def grad_at(run: RunContext, weights: dict[str, torch.Tensor], data: ImageSet) -> dict:
    """The mean cross-entropy gradient of the client's data at ``weights`` (train mode)."""
    model = model_from_state(run, weights).train()
    loss = F.cross_entropy(model(run.train_transform(data.images)), data.labels)
    loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def small(like: dict[str, torch.Tensor], seed: int, scale: float = 0.05) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(v.shape, generator=g) for k, v in like.items()}


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6)


def params(run: RunContext, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = [n for n, _ in model_from_state(run, state).named_parameters()]
    return {n: state[n] for n in names}


#: The role tests' clients: each a different sample count, arriving scrambled.
ROLE_COUNTS = {0: 5, 1: 40, 2: 12, 3: 90, 4: 27}
ROLE_ARRIVAL = (3, 0, 4, 2, 1)


def scrambled_uploads(model: dict[str, torch.Tensor], missing: int) -> tuple[dict, float]:
    """Client ``c`` sends the constant model ``c + 1`` with its own count, in
    :data:`ROLE_ARRIVAL` order; ``missing`` sends nothing and one more client
    an unusable count (0). Returns the uploads and the data-size-weighted
    average over the kept clients, worked out by client id; a weighting that
    paired counts with clients in arrival order would be > 0.1 away
    (asserted here, so the inputs cannot be symmetric)."""
    unusable = 1 if missing != 1 else 3
    uploads = {
        c: Upload(
            tensors={k: torch.full_like(v, float(c + 1)) for k, v in model.items()},
            meta={"num_samples": 0 if c == unusable else ROLE_COUNTS[c]},
        )
        for c in ROLE_ARRIVAL
        if c != missing
    }
    kept = sorted(c for c in ROLE_COUNTS if c not in (missing, unusable))
    total = sum(ROLE_COUNTS[c] for c in kept)
    want = sum(ROLE_COUNTS[c] * (c + 1) for c in kept) / total
    arrival = [c for c in ROLE_ARRIVAL if c in kept]
    misread = sum(ROLE_COUNTS[a] * (c + 1) for a, c in zip(arrival, kept, strict=True)) / total
    assert abs(want - misread) > 0.1  # the pairing shows in the average
    return uploads, want
