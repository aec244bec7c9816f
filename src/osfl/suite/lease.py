"""What one lease of a GPU holds, in seconds a plan can fill (issue #50).

A lease (docs/gpu-suite.md) is about :data:`LEASE_MINUTES` of device time:
a bare machine starts (about :data:`START_MINUTES`, counted), runs one
command of at most :data:`COMMAND_MINUTES`, and, while it is still warm, a
second command sized to what is left. ``scripts/gpu_job.sh`` turns a
command's minutes into the suite's budget: an inner timeout
:data:`INNER_MARGIN_S` short of the command's limit (the bundle's last
writes, the kill's grace), and a plan budget :data:`BUDGET_MARGIN_S` shorter
still (``tests/suite/test_job.py`` holds the script to these numbers). Of
that budget the plan fills at most ``1 -`` :data:`RESERVE`: estimates are
estimates, and a step the inner timeout kills returns nothing.

The first command of a lease also spends its first seconds on the preflight
(:mod:`osfl.suite.preflight`) and the rates (:mod:`osfl.suite.rates`); the
later command finds both in its directory on the warm machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A lease's device time, the machine's start included.
LEASE_MINUTES = 15.0
#: One command's limit on a lent machine.
COMMAND_MINUTES = 10.0
#: A bare machine's start and the transfers of the two commands (counted in
#: the lease; an assumption, not measured: the first lease did not time it).
START_MINUTES = 1.0
#: The shortest command worth running (the script refuses less).
MIN_COMMAND_MINUTES = 2.0
#: ``scripts/gpu_job.sh``: the inner timeout is the command's limit less this.
INNER_MARGIN_S = 45.0
#: ... and the suite's budget the inner timeout less this.
BUDGET_MARGIN_S = 15.0
#: The share of a command's budget left unplanned.
RESERVE = 0.10
#: The preflight's seconds until a lease has measured them (its own bound: 90).
PREFLIGHT_GUESS_S = 60.0
#: The rates' measurement when a rates file does not say (about half a minute).
RATES_GUESS_S = 30.0


def command_budget_s(minutes: float) -> float:
    """The suite's budget in a command of ``minutes`` (``scripts/gpu_job.sh``)."""
    return max(0.0, 60.0 * minutes - INNER_MARGIN_S - BUDGET_MARGIN_S)


def plannable_s(budget_s: float) -> float:
    """What a plan may fill of ``budget_s``: all but the :data:`RESERVE`."""
    return (1.0 - RESERVE) * budget_s


def later_minutes(minutes: float, lease: float = LEASE_MINUTES) -> float:
    """The minutes of the lease's later command after a first of ``minutes``
    (0 when less than :data:`MIN_COMMAND_MINUTES` would be left)."""
    left = min(COMMAND_MINUTES, lease - START_MINUTES - minutes)
    return left if left >= MIN_COMMAND_MINUTES else 0.0


def first_overhead_s(rates: Mapping[str, Any], preflight_s: float | None) -> float:
    """The first command's seconds before any step: the preflight (measured
    by an earlier lease, else :data:`PREFLIGHT_GUESS_S`) and the rates'
    measurement (its own ``seconds``, else :data:`RATES_GUESS_S`)."""
    rates_s = rates.get("seconds")
    rates_s = float(rates_s) if isinstance(rates_s, int | float) else RATES_GUESS_S
    return (PREFLIGHT_GUESS_S if preflight_s is None else preflight_s) + rates_s


def lease_capacities(
    minutes: float, overhead_s: float, lease: float = LEASE_MINUTES
) -> list[float]:
    """Seconds a fresh lease's commands hold for steps: the first command of
    ``minutes`` less ``overhead_s``, then the later one (if any)."""
    caps = [plannable_s(command_budget_s(minutes)) - overhead_s]
    then = later_minutes(minutes, lease)
    if then > 0:
        caps.append(plannable_s(command_budget_s(then)))
    return [max(0.0, c) for c in caps]
