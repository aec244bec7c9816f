"""A progress board that records every bar it is asked for (not a test
module): what the training loops, the round loop and the live display are
checked against. A bar keeps its name, total, each advance, the description
set at each advance (``None``: kept) and whether it was closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from osfl.fl.progress import Progress, ProgressTask


@dataclass
class RecordedBar(ProgressTask):
    name: str
    total: float | None
    advances: list[float] = field(default_factory=list)
    descriptions: list[str | None] = field(default_factory=list)
    closed: bool = False

    def advance(self, amount: float = 1.0, *, description: str | None = None) -> None:
        self.advances.append(amount)
        self.descriptions.append(description)

    def close(self) -> None:
        self.closed = True


class RecordingBoard(Progress):
    """``enabled``: whether the code under test should compute what a shown
    bar displays (the loss), as it does for a live board."""

    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.bars: list[RecordedBar] = []

    def task(self, description: str, total: float | None = None) -> RecordedBar:
        self.bars.append(RecordedBar(description, total))
        return self.bars[-1]

    def named(self, name: str) -> list[RecordedBar]:
        return [b for b in self.bars if b.name == name]
