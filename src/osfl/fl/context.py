"""What every party of a run knows before round 0 (:class:`RunContext`) and
what one client knows of one round (:class:`ClientContext`), including the
state a client keeps between rounds (:class:`ClientState`).

A module of its own because the method contract, the training loop, the
client cache and the runtimes all read these types; it imports none of them.

Client state follows Flower's contract, where a ClientApp's per-node state
lives in ``Context.state`` and survives between the rounds of a run: a method
reads and writes ``ctx.state`` inside ``client_update`` (SCAFFOLD's ``c_i``,
FedDyn's gradient state, EFTViT's private local module) and the runtime
persists it — a dict of serialised states in the simulation, the SuperNode's
``Context.state`` under Flower — so nothing a client keeps lives on the
method object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from osfl.fl.progress import Progress
from osfl.fl.secagg_config import SecAggPlusConfig
from osfl.fl.seeds import derive_seed
from osfl.fl.server_config import ServerConfig
from osfl.fl.upload import Message
from osfl.models import create_model

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.data.transforms import Transform
    from osfl.fl.cache import ClientCache
    from osfl.fl.train_config import TrainConfig

__all__ = [
    "ClientContext",
    "ClientState",
    "ModelSpec",
    "RunContext",
    "SharedTraining",
    "derive_seed",
]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model name and its keyword arguments (``num_classes`` is the
    task's; ``kwargs["pretrained"]`` a checkpoint to start from, whose content
    hash ``weights_sha256`` is part of the spec's identity: a path names a
    file, the hash names the weights)."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    weights_sha256: str | None = None

    def build(self, num_classes: int) -> nn.Module:
        return create_model(self.name, num_classes=num_classes, **dict(self.kwargs))

    def build_meta(self, num_classes: int) -> nn.Module:
        """The model on the ``meta`` device: its structure (types, shapes, names)
        without allocating or initialising weights (nor reading a checkpoint),
        for checks."""
        kwargs = {k: v for k, v in self.kwargs.items() if k != "pretrained"}
        with torch.device("meta"):
            return create_model(self.name, num_classes=num_classes, **kwargs)

    def key(self) -> dict[str, Any]:
        key = {"name": self.name, "kwargs": dict(sorted(self.kwargs.items()))}
        if self.weights_sha256 is not None:
            key["weights_sha256"] = self.weights_sha256
        return key


@dataclass
class RunContext:
    """What every party knows before round 0: the task, the model, the local
    training recipe, the transforms, the seed, the device, the cache, the
    progress board long loops report to, the server's public rules (robust
    aggregation, member screening, upload limits: ``server``) and the class
    names the parties agreed on.

    It is the same object on the server and on each client in simulation; under
    Flower each process builds an equal one from the same config, except that
    a real-sites server adds its own ``server_secret`` (kept out of ``repr``).
    """

    num_classes: int
    image_shape: tuple[int, int, int]
    num_clients: int
    model: ModelSpec
    train: TrainConfig
    train_transform: Transform
    eval_transform: Transform
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    cache: ClientCache | None = None
    progress: Progress = field(default_factory=Progress)
    server: ServerConfig = field(default_factory=ServerConfig)
    secagg: SecAggPlusConfig = field(default_factory=SecAggPlusConfig)
    classes: tuple[str, ...] = ()  # the class names in label order, where known
    #: The one thing here no client knows: on a real-sites server, a random
    #: secret of this run, drawn by the server and sent nowhere, from which
    #: its rule's random draws (DnC's coordinates) are seeded
    #: (:func:`osfl.fl.aggregators.draw_seed`); ``None`` everywhere else.
    server_secret: str | None = field(default=None, repr=False)


class ClientState(Message):
    """What one client keeps between rounds: named tensors + JSON-able metadata.

    Serialised with safetensors like an upload (never pickle), so a runtime can
    store it anywhere bytes go (Flower's ``Context.state``); it never leaves the
    client.
    """


@dataclass
class ClientContext:
    """One client's view of one round: its id, the round, a seeded generator and
    its own state from earlier rounds (empty in its first round; what the method
    leaves in it is kept for the next)."""

    run: RunContext
    client_id: int
    round: int
    generator: torch.Generator
    state: ClientState = field(default_factory=ClientState)

    @property
    def device(self) -> torch.device:
        return self.run.device

    def seed_for(self, *parts: object) -> int:
        """A deterministic seed from the run seed, this client and ``parts``."""
        return derive_seed(self.run.seed, self.client_id, self.round, *parts)


@dataclass(frozen=True)
class SharedTraining:
    """What every client of a round trains when its turn is the plain shared
    step of :func:`~osfl.fl.client_training.train_client`: ``model`` (holding
    the common initial weights) with ``cfg``, the run's augmentation,
    cross-entropy, no objective terms. A method that offers it
    (:class:`osfl.fl.method.SharedTrainingStep`) lets the simulation train the
    round's clients together (``batch_clients``). ``select``: the part of a
    client's data it trains on (FENS holds a share out), the same function its
    own turn applies, so that the batched step stores the entry that turn looks
    up; ``None``: all of it. Here, beside the other shared types, so that the
    method contract need not import the training code."""

    model: nn.Module
    cfg: TrainConfig
    select: Callable[[ClientContext, ImageSet], ImageSet] | None = None
