"""A step's price in seconds (issues #40, #50): its work over this machine's
measured rates (:meth:`osfl.suite.steps.Work.seconds`, the ``base``), times
the scale factor the suite learned from earlier leases
(:mod:`osfl.suite.learn`); and, for what no lease can hold, the rate that
would bring it in reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.suite.learn import Learned
from osfl.suite.steps import Step, rate_of

#: How far a rate is searched for one that brings a step in reach.
REACH_MAX_SCALE = 1000.0


@dataclass(frozen=True)
class Pricing:
    """Estimates at ``rates`` with ``learned`` factors (none in a dry run,
    whose tiny commands no lease measured)."""

    rates: Mapping[str, Any]
    learned: Learned = field(default_factory=Learned)
    dry_run: bool = False

    def base(self, step: Step, rates: Mapping[str, Any] | None = None) -> float:
        """The estimate before any learned factor."""
        return step.estimate(self.rates if rates is None else rates, dry_run=self.dry_run)

    def kind(self, step: Step) -> str:
        return step.work_for(dry_run=self.dry_run).kind(self.rates)

    def factor(self, step: Step) -> tuple[float, str]:
        if self.dry_run:
            return 1.0, "none"
        return self.learned.factor(step.name, self.kind(step))

    def estimate(self, step: Step, rates: Mapping[str, Any] | None = None) -> float:
        return self.base(step, rates) * self.factor(step)[0]

    def dominant(self, steps: Sequence[Step]) -> str:
        """The unit most of ``steps``' time goes to (``fixed``: their own costs)."""
        busy: dict[str, float] = {"fixed": 0.0}
        for s in steps:
            work = s.work_for(dry_run=self.dry_run)
            busy["fixed"] += work.fixed_s
            for k, v in work.busy(self.rates).items():
                busy[k] = busy.get(k, 0.0) + v
        return max(busy, key=lambda k: busy[k])

    def reach(self, steps: Sequence[Step], fits: Callable[[Sequence[float]], bool]) -> str:
        """Why ``steps`` (a step, or a row's parts and its row) fit no lease,
        and from which rate of their dominant unit they would: ``fits`` says
        whether their estimates, in order, fit a fresh lease."""
        unit = self.dominant(steps)
        if unit == "fixed":
            return "out of reach at any rate: its fixed costs alone fill more than a lease"

        def at(scale: float) -> bool:
            rates = {**self.rates, unit: rate_of(self.rates, unit) * scale}
            return fits([self.estimate(s, rates) for s in steps])

        if not at(REACH_MAX_SCALE):
            return f"out of reach at any {unit} rate: its other costs fill more than a lease"
        lo, hi = 1.0, REACH_MAX_SCALE
        while hi / lo > 1.0002:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if at(mid) else (mid, hi)
        now = rate_of(self.rates, unit)
        step = 10.0 ** (math.floor(math.log10(now * hi)) - 2)  # up, to 3 significant figures
        need = math.ceil(now * hi / step) * step
        return f"in reach from about {need:,.0f} {unit} images/s (now {now:,.0f})"
