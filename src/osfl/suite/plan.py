"""The plan of the catalogue's steps that fit a budget (issues #32, #40).

:func:`select_steps` picks the steps of ``--sections`` / ``--steps`` (and
the steps they need) from :data:`osfl.suite.catalogue.STEPS`;
:func:`make_plan` marks, in order of value, those whose estimates (their
:class:`~osfl.suite.steps.Work` over this machine's measured rates,
:mod:`osfl.suite.rates`) fit what is left of the budget. Nothing is keyed by
a GPU's name, and nothing is calibrated: a step whose estimate exceeds
:data:`~osfl.suite.steps.STEP_CAP_S` can never fit one command and is never
run (``--steps`` forces it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError
from osfl.suite.catalogue import STEPS
from osfl.suite.steps import STEP_CAP_S, Step


def select_steps(
    sections: Sequence[str], steps: Sequence[Step] = STEPS, names: Sequence[str] = ()
) -> list[Step]:
    """The catalogue's steps of ``sections`` (every section when empty), or
    the steps ``names`` (``--steps``), and the steps they need (the
    encoder), in the catalogue's order of value."""
    unknown = sorted(set(sections) - {s.section for s in steps})
    if unknown:
        valid = ", ".join(dict.fromkeys(s.section for s in steps))
        raise ConfigError(f"unknown suite section(s) {', '.join(unknown)}; valid: {valid}")
    bad = sorted(set(names) - {s.name for s in steps})
    if bad:
        raise ConfigError(f"unknown suite step(s) {', '.join(bad)}; `osfl suite list` names them")
    if names:
        chosen = set(names)
    else:
        chosen = {s.name for s in steps if not sections or s.section in sections}
    chosen |= {n for s in steps if s.name in chosen for n in s.needs}
    return [s for s in steps if s.name in chosen]


@dataclass
class Planned:
    """One step's place in the plan: its estimate, and what became of it.

    ``outputs``: relative path -> sha256 of the files a finished step's rows
    are read from (``resume`` trusts "done" only while they still match)."""

    step: Step
    estimate_s: float | None = None
    status: str = "pending"  # pending | planned | skipped | done | failed | in_repo
    reason: str = ""
    seconds: float | None = None
    out: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["step"] = {"name": self.step.name, "section": self.step.section, "kind": self.step.kind}
        return d


def make_plan(
    planned: Sequence[Planned],
    budget_s: float,
    *,
    cap_s: float = STEP_CAP_S,
    forced: Sequence[str] = (),
) -> list[Planned]:
    """Mark, in order of value, the pending steps whose estimates fit what is
    left of ``budget_s`` as ``planned``; the others ``skipped`` with why (a
    later, cheaper step may still fit where an earlier one did not). A step
    over ``cap_s`` never fits one command and is skipped whatever the budget;
    a step whose ``needs`` are not planned is skipped too. A ``forced`` step
    is planned whatever its estimate (``--steps``)."""
    if not math.isfinite(budget_s):
        raise ConfigError(f"the budget must be a finite number of seconds, got {budget_s}")
    left = budget_s
    chosen = {p.step.name for p in planned if p.status in ("done", "in_repo")}
    for p in planned:
        if p.status != "pending":
            continue
        missing = [n for n in p.step.needs if n not in chosen]
        if missing:
            p.status, p.reason = "skipped", f"needs {', '.join(missing)}, not planned"
        elif p.step.name in forced:
            p.status, p.reason = "planned", "forced (--steps)"
            left -= p.estimate_s or 0.0
            chosen.add(p.step.name)
        elif p.estimate_s is None:
            p.status, p.reason = "skipped", "no estimate"
        elif p.estimate_s > cap_s:
            p.status = "skipped"
            p.reason = (
                f"estimate {p.estimate_s:.0f} s > the {cap_s:.0f}-s cap of one step: "
                "it cannot fit one command (split it, or force it with --steps)"
            )
        elif p.estimate_s > left:
            p.status = "skipped"
            p.reason = f"estimate {p.estimate_s:.0f} s > {left:.0f} s left of the budget"
        else:
            p.status = "planned"
            left -= p.estimate_s
            chosen.add(p.step.name)
    return list(planned)
