"""Robustness experiments: clients that send poison (:mod:`.byzantine`), the
attack side of what the server's robust rules (:mod:`osfl.fl.aggregators`,
``server.member_filter``, the upload specs) defend against."""

from osfl.robustness.byzantine import (
    POISONS,
    ByzantineConfig,
    ByzantineMethod,
    apply_byzantine,
    byzantine_config,
    poisoned_by,
)

__all__ = [
    "POISONS",
    "ByzantineConfig",
    "ByzantineMethod",
    "apply_byzantine",
    "byzantine_config",
    "poisoned_by",
]
