"""What an ``osfl suite run`` call asks (:class:`SuiteRequest`: the
command line's options, or a test's steps and rates) and what it returns
(:class:`SuiteResult`), apart from :mod:`osfl.suite.execute`, which carries
a request out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfl.suite.plan import Planned
from osfl.suite.steps import Step

PREFLIGHT_MODES = ("auto", "all", "imports", "none")


@dataclass
class SuiteRequest:
    out: Path
    budget_min: float
    sections: Sequence[str] = ()
    #: ``--steps``: exactly these steps (and what they need), forced into the plan
    step_names: Sequence[str] = ()
    dry_run: bool = False
    pack_dir: Path | None = None
    steps: Sequence[Step] | None = None  # the catalogue's (tests pass their own)
    #: measured rates to use instead of measuring (tests; ``--rates FILE``)
    rates: Mapping[str, Any] | None = None
    #: where the bundle goes (None: ``<out>/bundle``)
    bundle: Path | None = None
    #: the repository whose rows, encoder and learned factors the plan reads
    repo: Path | None = None
    #: minutes of the lease's later command on this machine (0: none follows)
    then_min: float = 0.0
    #: ``all`` (imports and every method on the GPU), ``imports``, ``none``;
    #: ``auto``: ``all`` on a real run, ``imports`` in a dry run
    preflight: str = "auto"


@dataclass
class SuiteResult:
    planned: list[Planned]
    rows: list[dict[str, Any]] = field(default_factory=list)
    rates_s: float = 0.0
    wall_s: float = 0.0
