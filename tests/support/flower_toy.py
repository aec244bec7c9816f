"""A toy method for the Flower runtime's tests: server state w (3 floats), a
client returns w + mean label + seeded noise; ``toy_job`` runs it on 12 images."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.context import ClientContext, ModelSpec, RunContext
from osfl.fl.method import Method, MultiRound, Predictor, sample_fraction
from osfl.fl.runtime.base import Job, PartitionedData
from osfl.fl.train_config import TrainConfig
from osfl.fl.upload import NUM_SAMPLES, Broadcast, TensorSpec, Upload, UploadSpec
from osfl.flower.spec import JobSpec


# --------------------------------------------------------------------------- a toy method
@dataclass(frozen=True)
class ToyConfig:
    rounds: int = 3
    client_fraction: float = 1.0
    nan_clients: tuple[int, ...] = ()  # these clients upload NaN: refused by validation
    crash_client: int = -1  # this client's update raises: an error reply under Flower


class WeightPredictor(Predictor):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.register_buffer("w", w.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :3] * self.w


class Toy(Method, MultiRound):
    """Server state w (3 floats); a client returns w + mean label + noise drawn
    from its seeded generator; the server averages in client order."""

    name: ClassVar[str] = "toy"
    Config = ToyConfig

    @property
    def rounds(self) -> int:
        return self.config.rounds

    def sample_clients(self, round: int, num_clients: int, rng: Any) -> list[int]:
        return sample_fraction(self.config.client_fraction, round, num_clients, rng)

    def init_state(self) -> torch.Tensor:
        return torch.zeros(3)

    def broadcast(self, state: torch.Tensor, round: int) -> Broadcast:
        return Broadcast(tensors={"w": state}, meta={"round": round})

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        if ctx.client_id == self.config.crash_client:
            raise RuntimeError("disk full")
        w = (
            broadcast.tensors["w"]
            + data.labels.float().mean()
            + torch.rand(3, generator=ctx.generator)
        )
        if ctx.client_id in self.config.nan_clients:
            w = w * float("nan")
        return Upload(tensors={"w": w}, meta={"num_samples": len(data)})

    def upload_spec(self, state: torch.Tensor, round: int, client: int) -> UploadSpec:
        return UploadSpec(
            tensors={"w": TensorSpec((3,), torch.float32)}, meta={"num_samples": NUM_SAMPLES}
        )

    def aggregate(
        self, state: torch.Tensor, uploads: dict[int, Upload], round: int
    ) -> torch.Tensor:
        return torch.stack([uploads[c].tensors["w"] for c in sorted(uploads)]).mean(0)

    def predictor(self, state: torch.Tensor) -> Predictor:
        return WeightPredictor(state)


def toy_job(spec: JobSpec | None = None, seed: int = 3, **cfg: Any) -> Job:
    n = 12
    train = ImageSet(
        images=torch.arange(n * 4, dtype=torch.uint8).reshape(n, 1, 2, 2),
        labels=torch.arange(n, dtype=torch.int64) % 4,
        classes=("a", "b", "c", "d"),
    )
    fed = SimpleNamespace(
        client_indices=[list(range(c, n, 3)) for c in range(3)], key=lambda: "toy-fed"
    )
    run = RunContext(
        num_classes=4,
        image_shape=(1, 2, 2),
        num_clients=3,
        model=ModelSpec("toy"),
        train=TrainConfig(),
        train_transform=None,  # type: ignore[arg-type]
        eval_transform=None,  # type: ignore[arg-type]
        seed=seed,
    )
    return Job(
        method=Toy(ToyConfig(**cfg), run),
        run=run,
        clients=PartitionedData(train, fed),  # type: ignore[arg-type]
        seed=seed,
        evaluator=lambda p: {"score": float(p.w.sum())},
    )
