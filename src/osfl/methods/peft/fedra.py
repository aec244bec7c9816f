"""FedRA: random layer allocation for federated LoRA tuning.

Su, Li & Xue, "FedRA: A Random Allocation Strategy for Federated Tuning to
Unleash the Power of Heterogeneous Clients", ECCV 2024 (public code:
github.com/leondada/FedRA, ``server.py::get_para_range`` /
``agg_range_fill``, ``client.py::train_baseline``). Every round the server
draws a random allocation matrix: client i receives ``depth_i`` of the L
blocks of the global model, chosen without replacement and stacked in their
original order (its device holds no more); LoRA (rank 8, alpha 8, dropout
0.1) sits on every block's attention projection ``attn.proj`` and
``mlp.fc2``; the client trains the LoRA of its blocks and the head; the
server averages each block's LoRA over the clients that held it (blocks
nobody held keep their values) and the head over all clients, uniformly.

Client depths cycle over ``depths`` (the code's ``net_type`` default
``[12, 10, 8, 6, 4, 3]``, one depth per client). The allocation of every
client travels in the broadcast (``fedra.allocation``, N × L, 0/1), drawn
from the run seed and the round, so the server's spec for each upload knows
exactly which blocks that client may return.

Where the public code differs: PEFT's ``target_modules=['proj', 'mlp.fc2']``
matches by suffix and so also puts LoRA on ``patch_embed.proj``; we follow
the paper (attention projection and fc2 only). The code uploads and averages
the norms but never unfreezes them; ``train_norms=true`` trains them
(the allocated blocks' norm1/norm2 and the final norm).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import MethodCard, register_method
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Broadcast
from osfl.methods.clients import StateDict
from osfl.methods.peft.base import PEFTConfig, PEFTMethod, SubsetViT, bool_matrix, peft_smoke
from osfl.methods.peft.lora import add_lora, reset_lora
from osfl.methods.peft.methods import LORA_MARK, LoRAConfig

ALLOCATION_KEY = "fedra.allocation"
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_NORMS = {"norm", "norm1", "norm2", "fc_norm"}


def block_index(name: str) -> int | None:
    """``blocks.7.attn.proj.lora_A`` -> 7; ``None`` outside the blocks."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def random_allocation(depths: list[int], num_layers: int, rng: np.random.Generator) -> np.ndarray:
    """FedRA's allocation matrix: row i marks ``depths[i]`` of ``num_layers``
    blocks drawn without replacement (N × L, uint8)."""
    rows = [np.sort(rng.choice(num_layers, size=d, replace=False)) for d in depths]
    return bool_matrix(rows, num_layers)


@dataclass(frozen=True)
class FedRAConfig(PEFTConfig):
    """``depths``: client i holds ``depths[i % len(depths)]`` blocks (public
    code's default for a 12-block ViT). Uniform averaging, as the code."""

    #: blocks each client holds, client i getting depths[i % len(depths)]
    depths: list[int] = field(default_factory=lambda: [12, 10, 8, 6, 4, 3])
    #: the LoRA adapters
    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig(rank=8, alpha=8.0, dropout=0.1))
    #: also train the LayerNorms of the allocated blocks
    train_norms: bool = False
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.depths or any(d < 1 for d in self.depths):
            raise ConfigError(
                f"depths must be a non-empty list of positive ints, got {self.depths}"
            )


@register_method("fedra")
class FedRA(PEFTMethod):
    """Server state: the global LoRA of every block + the head (+ norms)."""

    Config: ClassVar[type] = FedRAConfig
    needs_vit: ClassVar[bool] = True
    card: ClassVar[MethodCard] = dataclasses.replace(
        PEFTMethod.card,
        summary=(
            "Federated LoRA where each client tunes a random subset of a pretrained ViT's blocks, "
            "as many as it can hold."
        ),
        paper=(
            'Su, Li & Xue, "FedRA: A Random Allocation Strategy for Federated Tuning to Unleash '
            'the Power of Heterogeneous Clients", ECCV 2024'
        ),
        smoke=peft_smoke("fedra", "method.fedra.depths=[2,1]"),
    )

    def __init__(self, config: FedRAConfig, run: Any):
        super().__init__(config, run)
        self._allocations: dict[int, np.ndarray] = {}

    @property
    def secure_weighting(self) -> str | None:
        """None: each tensor is averaged over the clients that hold it, a
        denominator per tensor that a masked sum cannot carry."""
        return None

    def num_layers(self) -> int:
        return len(self.meta_model().blocks)  # type: ignore[arg-type]

    def depth_of(self, client: int) -> int:
        return self.config.depths[client % len(self.config.depths)]

    def check(self) -> None:
        super().check()
        too_deep = [d for d in self.config.depths if d > self.num_layers()]
        if too_deep:
            raise ConfigError(
                f"method.fedra.depths {too_deep} exceed the model's {self.num_layers()} blocks; "
                f"set e.g. method.fedra.depths=[{self.num_layers()},{max(1, self.num_layers() // 2)}]"
            )

    def allocation(self, round: int) -> np.ndarray:
        """The round's allocation matrix (N × L), a function of seed and round."""
        if round not in self._allocations:
            rng = np.random.default_rng(derive_seed(self.run.seed, "fedra-allocation", round))
            depths = [self.depth_of(c) for c in range(self.run.num_clients)]
            self._allocations[round] = random_allocation(depths, self.num_layers(), rng)
        return self._allocations[round]

    # --- trainable set ----------------------------------------------------------
    def adapt(self, model: nn.Module) -> None:
        lo = self.config.lora
        add_lora(model, ["attn.proj", "mlp.fc2"], lo.rank, lo.alpha, dropout=lo.dropout)

    def reset_adapters(self, model: nn.Module, generator: torch.Generator) -> None:
        reset_lora(model, generator)

    def is_trainable(self, name: str) -> bool:
        if LORA_MARK in name or name.startswith(self.head_prefix()):
            return True
        return self.config.train_norms and bool(_NORMS & set(name.split(".")))

    def client_names(self, round: int, client: int) -> list[str]:
        """The LoRA (and norms) of the client's allocated blocks + the head."""
        held = set(np.flatnonzero(self.allocation(round)[client]).tolist())
        return [
            n for n in self.trainable_names() if block_index(n) is None or block_index(n) in held
        ]

    # --- wire and view ------------------------------------------------------------
    def broadcast(self, state: StateDict, round: int) -> Broadcast:
        b = super().broadcast(state, round)
        b.tensors[ALLOCATION_KEY] = torch.from_numpy(self.allocation(round))
        return b

    def model_tensors(self, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        return {k: v for k, v in broadcast.tensors.items() if k != ALLOCATION_KEY}

    def client_view(self, ctx: ClientContext, model: nn.Module, broadcast: Broadcast) -> nn.Module:
        row = broadcast.tensors[ALLOCATION_KEY][ctx.client_id]
        return SubsetViT(model, torch.nonzero(row).flatten().tolist())  # type: ignore[arg-type]

    def report(self, state: StateDict) -> dict[str, Any]:
        """Costs per client depth (FedRA's clients differ in depth)."""
        by_depth: dict[str, Any] = {}
        for c in range(self.run.num_clients):
            key = str(self.depth_of(c))
            if key not in by_depth:
                by_depth[key] = self.client_costs(0, c)
        return {"client_by_depth": by_depth}
