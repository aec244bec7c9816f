"""``osfl suite plan``: what successive leases would run, previewed in
seconds without a GPU (issue #50).

Given a saved ``rates.json`` (a job's, or typed by hand), each lease is
planned as ``osfl suite run`` would plan it (:func:`osfl.suite.plan.make_plan`,
the learned factors of the repository's state, :mod:`osfl.suite.learn`):
a fresh machine, a first command of ``minutes`` (its preflight and rates
measured first) and a later command sized to what is left of the lease
(:mod:`osfl.suite.lease`). Every step a lease plans is taken to finish in
its estimate and its rows to be imported before the next lease (a trained
encoder committed with them), so the next lease plans what is left. After
the last lease, what is still in reach and what is out of reach at these
rates (with the rate that would bring it in reach) are listed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osfl.suite.catalogue import STEPS
from osfl.suite.learn import Learned
from osfl.suite.lease import (
    LEASE_MINUTES,
    command_budget_s,
    first_overhead_s,
    later_minutes,
    lease_capacities,
)
from osfl.suite.plan import Planned, make_plan, mark_in_repo, select_steps
from osfl.suite.pricing import Pricing
from osfl.suite.rates import check_rates
from osfl.suite.steps import ENCODER_STEP, Step, rate_of


@dataclass
class LeasePreview:
    """One lease: the steps of each command, in order, and the steps whose
    rows it returns (a row's parts return none)."""

    index: int
    commands: list[list[Planned]]
    rows: list[Planned]


@dataclass
class Preview:
    rates: dict[str, Any]
    minutes: float
    capacities: list[float]
    overhead_s: float
    leases: list[LeasePreview]
    #: the plan a further lease would make: what is left, and why
    left: list[Planned]
    learned: Learned


def _plan_lease(
    steps: Sequence[Step],
    pricing: Pricing,
    caps: Sequence[float],
    imported: Mapping[str, str],
    encoder: bool,
) -> list[Planned]:
    planned = [Planned(s) for s in steps]
    for p in planned:
        p.base_s = pricing.base(p.step)
        p.factor, p.factor_from = pricing.factor(p.step)
        p.kind = pricing.kind(p.step)
        p.estimate_s = p.base_s * p.factor
    mark_in_repo(planned, imported, encoder="the repository" if encoder else None)
    return make_plan(planned, caps, reach=pricing.reach)


def preview_leases(
    rates: Mapping[str, Any],
    *,
    minutes: float = 10.0,
    leases: int = 3,
    sections: Sequence[str] = (),
    steps: Sequence[Step] = STEPS,
    in_repo: Mapping[str, str] | None = None,
    encoder: bool = False,
    learned: Learned | None = None,
    lease_minutes: float = LEASE_MINUTES,
) -> Preview:
    """Plan ``leases`` successive leases at ``rates`` (module docstring);
    ``in_repo`` / ``encoder``: the rows and encoder the repository holds now."""
    rates = check_rates(rates, "the rates")
    learned = learned or Learned()
    pricing = Pricing(rates, learned)
    overhead = first_overhead_s(rates, learned.preflight_s)
    caps = lease_capacities(minutes, overhead, lease_minutes)
    selected = select_steps(sections, steps)
    imported = dict(in_repo or {})
    out: list[LeasePreview] = []
    for k in range(leases):
        planned = _plan_lease(selected, pricing, caps, imported, encoder)
        ran = [p for p in planned if p.status in ("planned", "later")]
        if not ran:
            break
        commands = [[p for p in ran if p.command == c] for c in range(len(caps))]
        rows = [p for p in ran if not p.step.feeds]
        imported |= {p.step.name: f"lease {k + 1}" for p in rows}
        encoder = encoder or any(p.step.name == ENCODER_STEP for p in rows)
        out.append(LeasePreview(k + 1, commands, rows))
    left = _plan_lease(selected, pricing, caps, imported, encoder)
    return Preview(dict(rates), minutes, caps, overhead, out, left, learned)


def _rates_line(rates: Mapping[str, Any]) -> str:
    keys = ("resnet18_32", "vits16_224", "vitti16_224", "decode", "resize_224")
    shown = []
    for k in keys:
        derived = "" if k in rates else " (derived)"
        shown.append(f"{k} {rate_of(rates, k):,.0f}{derived}")
    return ", ".join(shown) + f" images/s; start-up {float(rates.get('startup_s', 0)):.0f} s"


def preview_text(pv: Preview, lease_minutes: float = LEASE_MINUTES) -> str:
    """The preview as a person reads it: the rates and lease shape, then
    each lease's commands, then what is left."""
    then = later_minutes(pv.minutes, lease_minutes)
    mins = [pv.minutes, then][: len(pv.capacities)]
    lines = _header_lines(pv, mins)
    for lease in pv.leases:
        lines += _lease_lines(lease, pv.capacities, mins)
    lines += _left_lines(pv)
    return "\n".join(lines) + "\n"


def _header_lines(pv: Preview, mins: Sequence[float]) -> list[str]:
    """The rates, the shape of each lease and the learned factors: what
    every estimate below is computed from."""
    lines = [f"rates ({pv.rates.get('machine', 'given')}): {_rates_line(pv.rates)}"]
    shape = " then ".join(
        f"a {m:g}-min command ({command_budget_s(m):.0f} s of budget, {c:.0f} s for steps)"
        for m, c in zip(mins, pv.capacities, strict=True)
    )
    lines.append(
        f"each lease: {shape}; the first spends {pv.overhead_s:.0f} s on the preflight "
        "and the rates first, and 10 % of each budget stays unplanned"
    )
    factors = {
        **{f"step {k}": v for k, v in pv.learned.steps.items()},
        **{f"kind {k}": v for k, v in pv.learned.kinds.items()},
    }
    lines.append(
        "learned: " + (", ".join(f"{k} x{v:.2f}" for k, v in factors.items()) or "nothing yet")
    )
    return lines


def _lease_lines(
    lease: LeasePreview, capacities: Sequence[float], mins: Sequence[float]
) -> list[str]:
    """One lease: each command's steps with their estimates, and the rows it
    brings back."""
    lines = ["", f"lease {lease.index}"]
    for c, (steps, cap) in enumerate(zip(lease.commands, capacities, strict=True)):
        used = sum(p.estimate_s or 0.0 for p in steps)
        lines.append(f"  command {c + 1} ({mins[c]:g} min): {used:.0f} of {cap:.0f} s")
        for p in steps:
            what = f"part of {p.step.feeds}" if p.step.feeds else f"row {p.step.headline}"
            lines.append(f"    {p.step.name:34} {p.estimate_s or 0:6.0f} s  {what}")
    lines.append("  rows back: " + ", ".join(p.step.name for p in lease.rows))
    return lines


def _left_lines(pv: Preview) -> list[str]:
    """What the leases did not run: in reach for more leases, or out of
    reach, grouped by the reason (the rate that would bring it in reach)."""
    lines = ["", f"after {len(pv.leases)} lease(s):"]
    waiting = [p.step.name for p in pv.left if p.status in ("planned", "later", "skipped")]
    lines.append("  in reach, for more leases: " + (", ".join(waiting) or "nothing"))
    reasons: dict[str, list[str]] = {}
    for p in pv.left:
        if p.status == "out_of_reach":
            reasons.setdefault(p.reason, []).append(p.step.name)
    for why, names in reasons.items():
        lines.append(f"  {', '.join(names)}: {why}")
    return lines
