"""What the suite learns from a lease (issue #50): every finished or killed
step's measured seconds against its estimate, kept in the repository.

``osfl suite import`` adds each job of a bundle (its ``plan.json``: every
step's ``base_s``, the estimate before any learned factor, its kind of work
and its seconds; the preflight's and the rates' seconds; the rates) to
:data:`STATE` (``reproduction/gpu_suite/state.json``, committed with the
rows), keyed by the job's start so that importing a bundle again replaces
it. :func:`learned` turns the jobs into scale factors the next plan prices
with (:class:`osfl.suite.pricing.Pricing`):

- a step that finished: its own last ratio of seconds to ``base_s``;
- a step only ever killed (the inner timeout's SIGINT): it ran at least
  that long, so its largest ratio times :data:`KILLED_BUMP`; a step killed
  at the end of a command then prices beyond any command and is "out of
  reach" rather than killed again;
- any other step: the ratio of its kind of work (the unit most of its time
  goes to, :meth:`osfl.suite.steps.Work.kind`), summed over the finished
  steps of that kind: steps that took 1.3x their estimates make their kind
  1.3x dearer.

Every factor is clamped to [:data:`FACTOR_MIN`, :data:`FACTOR_MAX`].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.suite.bundle import read_json

#: The suite's state in a repository (relative to its root); not a
#: ``reproduction/*.json`` row file.
STATE = "reproduction/gpu_suite/state.json"
STATE_SCHEMA = "osfl.suite.state/1"
#: How much longer than it ran a killed step is priced.
KILLED_BUMP = 1.25
FACTOR_MIN, FACTOR_MAX = 0.25, 20.0


@dataclass(frozen=True)
class Learned:
    """Scale factors by step name and by kind of work, and the preflight's
    last measured seconds (``None``: no lease has measured it)."""

    steps: Mapping[str, float] = field(default_factory=dict)
    kinds: Mapping[str, float] = field(default_factory=dict)
    preflight_s: float | None = None

    def factor(self, name: str, kind: str) -> tuple[float, str]:
        """The factor for step ``name`` of kind ``kind``, and where it comes
        from (``step``, ``kind`` or ``none``)."""
        if name in self.steps:
            return self.steps[name], "step"
        if kind in self.kinds:
            return self.kinds[kind], "kind"
        return 1.0, "none"


def _clamp(x: float) -> float:
    return min(FACTOR_MAX, max(FACTOR_MIN, x))


def _ratio(obs: Mapping[str, Any]) -> float | None:
    seconds, base = obs.get("seconds"), obs.get("base_s")
    ok = all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in (seconds, base))
    return float(seconds) / float(base) if ok else None  # type: ignore[arg-type]


def learned(jobs: Sequence[Mapping[str, Any]]) -> Learned:
    """The factors the observations of ``jobs`` (oldest first) give."""
    done: dict[str, float] = {}
    killed: dict[str, float] = {}
    kind_sums: dict[str, list[float]] = {}
    preflight = None
    for job in jobs:
        seconds = job.get("preflight_s")
        if isinstance(seconds, int | float) and seconds > 0:  # 0: not run in that call
            preflight = float(seconds)
        for obs in job.get("steps", []):
            r = _ratio(obs)
            if r is None:
                continue
            if obs.get("status") == "done":
                done[obs["step"]] = r
                sums = kind_sums.setdefault(str(obs.get("kind", "")), [0.0, 0.0])
                sums[0] += float(obs["seconds"])
                sums[1] += float(obs["base_s"])
            elif obs.get("status") == "killed":
                killed[obs["step"]] = max(killed.get(obs["step"], 0.0), r * KILLED_BUMP)
    steps = {n: _clamp(f) for n, f in killed.items()}
    steps.update({n: _clamp(f) for n, f in done.items()})  # finished once: its own ratio
    kinds = {k: _clamp(s / b) for k, (s, b) in kind_sums.items() if b > 0}
    return Learned(dict(sorted(steps.items())), dict(sorted(kinds.items())), preflight)


def job_record(plan: Mapping[str, Any], rates: Mapping[str, Any]) -> dict[str, Any]:
    """One job's observations from its bundle's ``plan.json`` and rates: the
    steps that finished or were killed in this call (not those an earlier
    call into the same directory ran: that job's bundle has them), with
    their seconds and ``base_s``."""
    steps = []
    for s in plan.get("steps", []):
        if s.get("job") and plan.get("started") and s["job"] != plan["started"]:
            continue
        status = s.get("status")
        killed = status == "failed" and "interrupted" in str(s.get("reason", ""))
        if (status != "done" and not killed) or _ratio(s) is None:
            continue  # nothing to learn from (a failure, no seconds)
        steps.append(
            {
                "step": str(s["step"]["name"]),
                "kind": str(s.get("kind", "")),
                "status": "done" if status == "done" else "killed",
                "seconds": s.get("seconds"),
                "base_s": s.get("base_s"),
                "estimate_s": s.get("estimate_s"),
            }
        )
    overheads = plan.get("overheads") or {}
    keep = ("resnet18_32", "vits16_224", "vitti16_224", "decode", "resize_224", "startup_s")
    started = plan.get("started")
    return {
        "started": None if started is None else str(started),
        "machine": plan.get("machine"),
        "preflight_s": overheads.get("preflight_s"),
        "rates_s": overheads.get("rates_s"),
        "rates": {k: rates[k] for k in keep if isinstance(rates.get(k), int | float)},
        "steps": steps,
    }


def read_state(repo: Path | None) -> dict[str, Any]:
    """``repo``'s suite state (an empty one when there is none); a damaged
    file is one :class:`DataError` line."""
    empty: dict[str, Any] = {"schema": STATE_SCHEMA, "jobs": []}
    if repo is None or not (repo / STATE).exists():
        return empty
    doc = read_json(repo / STATE, dict)
    if doc.get("schema") != STATE_SCHEMA or not isinstance(doc.get("jobs"), list):
        raise DataError(f"{repo / STATE} is not an osfl suite state ({STATE_SCHEMA})")
    if not all(isinstance(j, dict) and isinstance(j.get("steps", []), list) for j in doc["jobs"]):
        raise DataError(f"{repo / STATE} is damaged (a job is not an object with steps)")
    return doc


def learned_in(repo: Path | None) -> Learned:
    """The factors ``repo``'s state gives."""
    return learned(read_state(repo)["jobs"])


def add_job(state: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """``state`` with ``job`` added, replacing a job with the same start."""
    jobs = [j for j in state["jobs"] if j.get("started") != job.get("started")]
    return {**state, "jobs": [*jobs, job]}
