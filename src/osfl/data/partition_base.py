"""What a partition scheme is: the data it reads (:class:`PartitionData`), its
contract (:class:`Scheme`: a frozen dataclass of parameters, ``check`` and
``split``) and the registry configs name schemes from (:data:`PARTITIONS`). A
module of its own so that the schemes (:mod:`osfl.data.partition_schemes`),
their Flower helpers and the entry point (:mod:`osfl.data.partition`) share it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from osfl.registry import Registry


@dataclass(frozen=True)
class PartitionData:
    """What a scheme reads: int64 labels, optional int64 domains, the class count."""

    labels: np.ndarray
    domains: np.ndarray | None
    num_classes: int

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])


class Scheme(ABC):
    """A partition scheme: a frozen dataclass of its parameters plus ``split``.

    ``check`` refuses impossible requests before any work; ``split`` returns one
    index array per client (unsorted is fine; :class:`Federation` sorts).
    """

    uses_domains: ClassVar[bool] = False

    def check(self, data: PartitionData, num_clients: int) -> None:  # noqa: B027
        """Raise DataError for a request this scheme cannot satisfy (default: none)."""

    @abstractmethod
    def split(self, data: PartitionData, num_clients: int, seed: int) -> list[np.ndarray]: ...


PARTITIONS: Registry[type[Scheme]] = Registry("partition scheme")
