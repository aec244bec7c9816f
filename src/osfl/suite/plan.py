"""The plan of the catalogue's steps that fit a lease (issues #32, #40, #50).

:func:`select_steps` picks the steps of ``--sections`` / ``--steps`` (and
the steps they need) from :data:`osfl.suite.catalogue.STEPS`;
:func:`make_plan` places, in order of value, each pending step in the
lease's commands (this one, then the same machine's later one:
:mod:`osfl.suite.lease`) where its estimate (:mod:`osfl.suite.pricing`)
fits what is left. Nothing is keyed by a GPU's name and nothing is
calibrated.

**No lease is spent on a part without its row.** A row whose clients train
in parts (``train_clients`` steps, whose ``feeds`` names the row's step) is
placed whole: its pending parts and its row step go into this command and
the later one together, a part never after its row, or none of them does.
What fits no fresh lease at these rates, alone or as such a whole, is
``out_of_reach``, with the rate that would bring it in reach; it is never
planned, so a command's rest is never filled with a part whose sibling
cannot follow. A row one of whose parts is done (an earlier command of
this lease trained it) is placed first.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError
from osfl.suite.catalogue import STEPS
from osfl.suite.steps import ENCODER_STEP, Step

#: ``reach(steps, fits)``: why ``steps`` fit no lease and from which rate
#: they would (:meth:`osfl.suite.pricing.Pricing.reach`).
Reach = Callable[[Sequence[Step], Callable[[Sequence[float]], bool]], str]


def select_steps(
    sections: Sequence[str], steps: Sequence[Step] = STEPS, names: Sequence[str] = ()
) -> list[Step]:
    """The catalogue's steps of ``sections`` (every section when empty), or
    the steps ``names`` (``--steps``), and the steps they need (the
    encoder, a row's parts), in the catalogue's order of value."""
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

    ``base_s``: the estimate before the learned ``factor`` (from ``factor_from``:
    the step's own past seconds, its ``kind`` of work's, or none);
    ``command``: 0 for this command, 1 for the lease's later one (status
    ``later``);
    ``outputs``: relative path -> sha256 of the files a finished step's rows
    are read from (``resume`` trusts "done" only while they still match)."""

    step: Step
    estimate_s: float | None = None
    #: pending | planned | later | skipped | out_of_reach | done | failed | in_repo
    status: str = "pending"
    reason: str = ""
    seconds: float | None = None
    out: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    base_s: float | None = None
    factor: float = 1.0
    factor_from: str = "none"
    kind: str = ""
    command: int | None = None
    #: the start of the call that ran it (its job, for what import learns)
    job: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["step"] = {"name": self.step.name, "section": self.step.section, "kind": self.step.kind}
        return d


#: Statuses that satisfy a need without running.
SETTLED = ("done", "in_repo")


def units(planned: Sequence[Planned]) -> list[list[Planned]]:
    """``planned`` in units placed whole, in order of value: a row's parts
    (``feeds``) with its row step after them, every other step alone."""
    names = {p.step.name: p for p in planned}
    part_of = {p.step.name: p.step.feeds for p in planned if p.step.feeds in names}
    out: list[list[Planned]] = []
    seen: set[str] = set()
    for p in planned:
        if p.step.name in seen:
            continue
        row = part_of.get(p.step.name) or (p.step.name if p.step.name in part_of.values() else "")
        members = (
            [q for q in planned if part_of.get(q.step.name) == row] + [names[row]] if row else [p]
        )
        seen |= {q.step.name for q in members}
        out.append(members)
    return out


def assign(
    estimates: Sequence[float], caps: Sequence[float], load: Sequence[float], earliest: int = 0
) -> list[int] | None:
    """Commands for steps of ``estimates`` (in order, each no earlier than
    the one before: a row after its parts) within ``caps`` less ``load``,
    earliest first; ``None`` when there are none."""
    order = sorted(
        itertools.product(range(earliest, len(caps)), repeat=len(estimates)),
        key=lambda a: (max(a, default=0), sum(a)),
    )
    for a in order:
        if any(x > y for x, y in itertools.pairwise(a)):
            continue
        used = list(load)
        for c, e in zip(a, estimates, strict=True):
            used[c] += e
        if all(u <= cap + 1e-9 for u, cap in zip(used, caps, strict=True)):
            return list(a)
    return None


class _Placer:
    """:func:`make_plan`'s state: the load of each command, where each step went."""

    def __init__(self, caps: Sequence[float], fresh: Sequence[float], reach: Reach | None):
        self.caps, self.fresh, self.reach = list(caps), list(fresh), reach
        self.load = [0.0] * len(caps)
        self.placed: dict[str, int] = {}

    def fits_fresh(self, estimates: Sequence[float]) -> bool:
        return assign(estimates, self.fresh, [0.0] * len(self.fresh)) is not None

    def put(self, p: Planned, command: int) -> None:
        p.command = command
        p.status = "planned" if command == 0 else "later"
        p.reason = "" if command == 0 else "in the lease's later command (same machine)"
        self.load[command] += p.estimate_s or 0.0
        self.placed[p.step.name] = command

    def forced(self, todo: Sequence[Planned]) -> None:
        for p in todo:
            self.put(p, 0)
            p.reason = "forced (--steps)"

    def missing(
        self, unit: Sequence[Planned], todo: Sequence[Planned], outside: set[str]
    ) -> list[str]:
        """What ``todo`` needs that is not placed, so the unit cannot run:
        a step outside the unit, or a part of this row that neither waits
        nor finished (a safety net: a new call plans every unfinished step
        afresh)."""
        missing = sorted(n for n in outside if n not in self.placed)
        missing += [q.step.name for q in unit if q not in todo and q.status not in SETTLED]
        return missing

    def place(self, unit: Sequence[Planned], todo: list[Planned]) -> None:
        inside = {p.step.name for p in unit}
        outside = {n for p in todo for n in p.step.needs} - inside
        missing = self.missing(unit, todo, outside)
        if missing:
            _skip(todo, f"needs {', '.join(missing)}, not planned")
            return
        if any(p.estimate_s is None for p in todo):
            _skip(todo, "no estimate")
            return
        est = [float(p.estimate_s) for p in todo]  # type: ignore[arg-type]
        earliest = max([0, *(self.placed[n] for n in outside)])
        where = assign(est, self.caps, self.load, earliest)
        if where is not None:
            for p, c in zip(todo, where, strict=True):
                self.put(p, c)
            return
        self.refuse(unit, todo, est)

    def refuse(
        self, unit: Sequence[Planned], todo: Sequence[Planned], est: Sequence[float]
    ) -> None:
        what = {1: "its estimate", 2: "its part and row step"}.get(
            len(unit), "its parts and row step"
        )
        secs = " + ".join(f"{e:.0f}" for e in est)
        holds = " + ".join(f"{c:.0f}" for c in self.fresh)
        if self.fits_fresh(est):
            left = " + ".join(f"{c - u:.0f}" for c, u in zip(self.caps, self.load, strict=True))
            status, why = "skipped", f"{what} ({secs} s) > what is left of this lease ({left} s)"
        else:
            status = "out_of_reach"
            why = (
                f"out of reach at this rate: {what} ({secs} s) fit no lease's commands ({holds} s)"
            )
            if self.reach is not None:
                why += "; " + self.reach([p.step for p in todo], self.fits_fresh)
        for p in todo:
            p.status, p.reason = status, why


def make_plan(
    planned: Sequence[Planned],
    capacities: Sequence[float],
    *,
    fresh: Sequence[float] | None = None,
    forced: Sequence[str] = (),
    reach: Reach | None = None,
) -> list[Planned]:
    """Place each pending step of ``planned`` (module docstring):
    ``capacities`` are the seconds this command and the lease's later one
    still hold for steps, ``fresh`` what a fresh lease's commands hold (the
    line between "not in this lease" and "out of reach"; default
    ``capacities``). A ``forced`` step (``--steps``) is planned into this
    command whatever its estimate. Returns ``planned``."""
    caps = _capacities(capacities)
    placer = _Placer(caps, caps if fresh is None else fresh, reach)
    placer.placed.update({p.step.name: -1 for p in planned if p.status in SETTLED})
    for unit in _started_first(units(planned)):
        todo = [p for p in unit if p.status == "pending"]
        if not todo:
            continue
        if any(p.step.name in forced for p in todo):
            placer.forced(todo)
        elif todo[-1].step.feeds:  # a part whose row is not in this selection
            for p in todo:
                p.status, p.reason = "skipped", f"a part of {p.step.feeds}, which is not selected"
        else:
            placer.place(unit, todo)
    return list(planned)


def _skip(todo: Iterable[Planned], reason: str) -> None:
    """Skip every step of a unit with one reason: a row is placed whole or
    not at all (module docstring)."""
    for p in todo:
        p.status, p.reason = "skipped", reason


def _capacities(capacities: Sequence[float]) -> list[float]:
    """The budget's seconds as floats, refused when empty or not finite (an
    infinite budget would plan every step, whatever it costs)."""
    caps = [float(c) for c in capacities]
    if not caps or not all(math.isfinite(c) for c in caps):
        raise ConfigError(f"the budget must be a finite number of seconds, got {capacities}")
    return caps


def _started_first(every: list[list[Planned]]) -> list[list[Planned]]:
    """The units with a part already done first (an earlier command of this
    lease trained it, so its row must follow), the others in value order."""
    started = [u for u in every if any(p.status == "done" for p in u)]
    return started + [u for u in every if u not in started]


def mark_in_repo(
    planned: Sequence[Planned],
    in_repo: Mapping[str, str],
    *,
    encoder: str | None = None,
    keep: Iterable[str] = (),
) -> None:
    """Mark the pending steps whose rows are in the repository (``in_repo``:
    step -> the file holding them; a row's parts go with their row)
    ``in_repo``, except those in ``keep`` (``--steps``). A step whose output
    a pending step still reads runs again (its rows are in the repository,
    its files are not on this machine), unless that output is the encoder
    and the repository holds a copy of it (``encoder``: its path): then the
    encoder step is ``in_repo`` too and what needs it reads that copy."""
    pending = [p for p in planned if p.status == "pending"]
    found = _found_in_repo(pending, in_repo, encoder)
    skip = {p.step.name for p in pending if p.step.name in found} - set(keep)
    reads = {n for p in pending if p.step.name not in skip for n in p.step.needs}
    skip -= {n for n in reads if not (n == ENCODER_STEP and encoder is not None)}
    for p in pending:
        if p.step.name in skip:
            where = found[p.step.name]
            p.status = "in_repo"
            p.reason = where if where.startswith("the encoder") else f"its rows are in {where}"


def _found_in_repo(
    pending: Sequence[Planned], in_repo: Mapping[str, str], encoder: str | None
) -> dict[str, str]:
    """Step -> where its rows are: ``in_repo``, each pending part of a row
    there (a part goes with its row) and the encoder when a copy is
    committed (``encoder``)."""
    found = dict(in_repo)
    found |= {p.step.name: found[p.step.feeds] for p in pending if p.step.feeds in found}
    if encoder is not None:
        found[ENCODER_STEP] = f"the encoder is committed at {encoder}"
    return found
