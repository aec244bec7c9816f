"""A ViT port of FEDBFPT (progressive training of shallow layers with sampled
deeper layers).

Wang, Li, Chen & Shou, "FedBFPT: An Efficient Federated Learning Framework
for BERT Further Pre-training", IJCAI 2023 (public code:
github.com/siabdullah4/FedBFPT, ``federated_train.py::fed_train``,
``utils.py::rebuild_model / train_trans_layer / federated_efficient_merge``),
written for BERT masked-language-model pre-training. Its mechanism, which is
what this port keeps:

- *Progressive Learning with Sampled Deeper layers (PL-SDL)*: at stage d the
  client model's first d blocks are the global blocks 0..d-1, and only block
  d-1 (+ the output head) trains; the client's deeper slots are global blocks
  sampled *with replacement* from [d, L), sorted (``rebuild_model``:
  ``np.sort(np.random.randint(d, 12, size))``), redrawn every round;
- d starts at 1 and advances when half of the remaining rounds have passed
  (``if i == rounds - floor(remain / 2): d += 1; remain = rounds - i``), so
  100 rounds give stages 1..7 (:func:`bfpt_stage`);
- the server averages the uploaded block and head uniformly over the clients
  (``federated_efficient_merge``) and keeps every other parameter.

What the port changes, because the task is not BERT pre-training: the
trained "head" is the ViT classifier (BERT's MLM head in the code), the loss
is the classification cross-entropy, and the client model's depth is
``client_depth`` blocks (null = the model's depth; the code's BERT clients
had 6 of 12, but EFTViT's Table 3 gives FEDBFPT the full model's forward
GFLOPs, 12.005, so its port used full-depth clients). The embeddings and the
final norm stay frozen, as in the code. Say ``client_depth=6`` to get the
code's shallow BERT clients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import MethodCard, register_method
from osfl.fl.upload import Broadcast
from osfl.methods.peft.base import PEFTConfig, PEFTMethod, SubsetViT, peft_smoke
from osfl.methods.peft.fedra import block_index


def bfpt_stage(round: int, rounds: int) -> int:
    """The public code's PL-SDL stage d of round ``round`` (0-based) of ``rounds``."""
    d, remain = 1, rounds
    for i in range(round + 1):
        if i == rounds - remain // 2:
            d += 1
            remain = rounds - i
    return d


@dataclass(frozen=True)
class FedBFPTConfig(PEFTConfig):
    """``client_depth``: blocks in a client's model (null = the model's depth).
    Uniform averaging, as the code."""

    #: ViT blocks in a client's model (null: all of them)
    client_depth: int | None = None
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.client_depth is not None and self.client_depth < 1:
            raise ConfigError(f"client_depth must be >= 1 or null, got {self.client_depth}")


@register_method("fedbfpt")
class FedBFPT(PEFTMethod):
    """Server state: the head and the global blocks trained so far."""

    Config: ClassVar[type] = FedBFPTConfig
    needs_vit: ClassVar[bool] = True
    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Trains a pretrained ViT's shallow blocks progressively, one more per stage, clients "
            "holding sampled deeper ones."
        ),
        paper=(
            'Wang et al., "FedBFPT: An Efficient Federated Learning Framework for BERT Further '
            'Pre-training", IJCAI 2023 (a ViT port)'
        ),
        smoke=peft_smoke("fedbfpt"),
    )

    def num_layers(self) -> int:
        return len(self.meta_model().blocks)  # type: ignore[arg-type]

    def client_depth(self) -> int:
        d = self.config.client_depth
        return self.num_layers() if d is None else d

    def check(self) -> None:
        super().check()
        if self.client_depth() > self.num_layers():
            raise ConfigError(
                f"method.fedbfpt.client_depth={self.client_depth()} exceeds the model's "
                f"{self.num_layers()} blocks"
            )

    def stage(self, round: int) -> int:
        """d of ``round``: block d-1 trains (capped at the client's depth)."""
        return min(bfpt_stage(round, self.rounds), self.client_depth())

    def is_trainable(self, name: str) -> bool:
        return name.startswith(self.head_prefix()) or block_index(name) is not None

    def _names(self, blocks: set[int]) -> list[str]:
        return [
            n for n in self.trainable_names() if block_index(n) is None or block_index(n) in blocks
        ]

    def global_names(self, round: int) -> list[str]:
        """The head and blocks 0..d-1 (what clients of stage d take from the server)."""
        return self._names(set(range(self.stage(round))))

    def client_names(self, round: int, client: int) -> list[str]:
        """Block d-1 and the head."""
        return self._names({self.stage(round) - 1})

    def deeper_layers(self, ctx: ClientContext) -> list[int]:
        """The client's sampled deeper blocks: ``client_depth - d`` draws from
        [d, L) with replacement, sorted (redrawn every round)."""
        d = self.stage(ctx.round)
        rng = np.random.default_rng(ctx.seed_for("fedbfpt-layers"))
        size = self.client_depth() - d
        return np.sort(rng.integers(d, self.num_layers(), size=size)).tolist() if size else []

    def client_view(self, ctx: ClientContext, model: nn.Module, broadcast: Broadcast) -> nn.Module:
        d = self.stage(ctx.round)
        return SubsetViT(model, [*range(d), *self.deeper_layers(ctx)])  # type: ignore[arg-type]

    def report(self, state: Any) -> dict[str, Any]:
        out = super().report(state)
        out["stages"] = [self.stage(r) for r in range(self.rounds)]
        return out
