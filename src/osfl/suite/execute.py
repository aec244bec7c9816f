"""``osfl suite run``: prove the GPU path, measure, plan within the lease,
run in order of value, and hand back the rows of what finished (issues
#32, #40, #50).

The commands run in this process through the ``run_command`` the CLI hands
in (``osfl.cli.main``: the very code path of ``osfl run`` / ``osfl
pretrain``; a ``script`` step's benchmark script runs through its own
``main``), each into its own directory; a step that fails is recorded with
its error and the suite goes on; Ctrl-C (or the job's inner timeout, which
sends SIGINT) stops it: the step is marked ``failed`` (interrupted) with
the seconds it ran, the plan written, no further step run, exit status
130. In order:

1. the preflight (:mod:`osfl.suite.preflight`): every module the catalogue
   imports and every method's tiny run on the GPU; a failure stops the job
   in one line (exit 2) with the report in ``plan.json``;
2. the rates (:mod:`osfl.suite.rates`), reused from ``rates.json`` by a
   later call into the same directory;
3. the plan (:mod:`osfl.suite.plan`): the estimates (work over the rates,
   times what earlier leases taught: :mod:`osfl.suite.learn`), placed in
   this command and the lease's later one (``then_min``), 10 % of the
   budget left unplanned (:mod:`osfl.suite.lease`);
4. the steps planned into this command, the rows and the bundle
   (:mod:`osfl.suite.bundle`) rewritten after each.

Written under the suite's directory: ``rates.json``, ``plan.json`` (every
step with its estimate, its learned factor, status, seconds and the sha256
of its outputs; the preflight; the seconds before the first step),
``runs/<step>/``, ``rows.json`` and ``reproduction_gpu.md``
(:mod:`osfl.suite.rows`), ``suite.log``, and the bundle (``--bundle``,
default ``<out>/bundle``).

A second call into the same directory goes on from the first (steps it
finished stay in the plan and the rows even when this call selects others;
a passed preflight is not run again): a step is "done" only while every
output it finished with still has its sha256; ``rows.json``, if missing, is
rebuilt from the done steps' directories; a damaged ``plan.json`` or
``rows.json`` is one error line (exit 2). Steps whose rows are already in
the repository (``reproduction/gpu_suite_*.json``, written by ``osfl suite
import``) are not run again, nor is the encoder once the repository holds
it (:mod:`osfl.suite.encoder`).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, DataError
from osfl.suite.bundle import archive_members, read_json, write_bundle
from osfl.suite.catalogue import STEPS
from osfl.suite.encoder import POSTPROCESS, committed_encoder
from osfl.suite.learn import Learned, learned_in
from osfl.suite.lease import (
    COMMAND_MINUTES,
    command_budget_s,
    first_overhead_s,
    lease_capacities,
    plannable_s,
)
from osfl.suite.plan import Planned, make_plan, mark_in_repo, select_steps
from osfl.suite.preflight import PreflightError, run_preflight
from osfl.suite.pricing import Pricing
from osfl.suite.rates import check_rates, measure_rates, read_rates
from osfl.suite.request import PREFLIGHT_MODES, SuiteRequest, SuiteResult
from osfl.suite.rows import rows_markdown, step_rows
from osfl.suite.step_io import (
    atomic_write,
    check_budget,
    free_gpu,
    fresh_dir,
    output_hashes,
    outputs_intact,
    resolve,
    rows_in_repo,
    run_script,
    use_pack,
    with_overrides,
)
from osfl.suite.steps import ENCODER, ENCODER_STEP, Step, command_text

__all__ = [
    "SuiteRequest",
    "SuiteResult",
    "check_budget",
    "rows_in_repo",
    "run_suite",
    "with_overrides",
]

RunCommand = Callable[[Sequence[str]], int]
Measure = Callable[..., dict[str, Any]]
#: ``preflight(mode, scripts)``: the report of :mod:`osfl.suite.preflight`'s checks.
Preflight = Callable[[str, Sequence[str]], dict[str, Any]]


class _Suite:
    def __init__(
        self,
        req: SuiteRequest,
        run_command: RunCommand,
        clock: Callable[[], float],
        log: Callable[[str], None],
        script: RunCommand = run_script,
    ):
        self.req, self.run_command, self.clock = req, run_command, clock
        self.run_script = script
        self._print = log
        self.start = clock()
        self.started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.budget_s = 60.0 * req.budget_min
        self.catalogue = list(req.steps) if req.steps is not None else list(STEPS)
        steps = select_steps(req.sections, self.catalogue, names=req.step_names)
        #: ``--steps``: the named steps and what they need run whatever their estimates
        self.forced = {s.name for s in steps} if req.step_names else set()
        self.planned = [Planned(s) for s in steps]
        self.by_name = {p.step.name: p for p in self.planned}
        self.rows: list[dict[str, Any]] = []
        self.rates: dict[str, Any] | None = None
        self.learned = Learned() if req.dry_run else learned_in(req.repo)
        self.encoder_copy = None if req.dry_run else committed_encoder(req.repo)
        self.preflight_doc: dict[str, Any] = {}
        self.overheads: dict[str, float] = {"preflight_s": 0.0, "rates_s": 0.0}
        self.capacities: dict[str, list[float]] = {}
        self.current: tuple[Planned, float] | None = None
        self.resume()

    def log(self, text: str) -> None:
        """Print, and keep it in ``suite.log`` (the bundle's log)."""
        self._print(text)
        with (self.req.out / "suite.log").open("a") as f:
            f.write(text + "\n")

    # ------------------------------------------------------------------ resume
    def resume(self) -> None:
        """Go on from an earlier call into the same directory: a step is done
        only while its outputs still have the sha256 it finished with; the
        rows of the done steps are kept, or rebuilt from their directories
        when ``rows.json`` is missing; a passed preflight is kept."""
        plan = self.req.out / "plan.json"
        if not plan.exists():
            return
        doc = read_json(plan, dict)
        if not isinstance(doc.get("steps"), list) or "dry_run" not in doc:
            raise DataError(f"{plan} is damaged (no steps or dry_run); remove it to start again")
        if doc["dry_run"] != self.req.dry_run:
            raise ConfigError(
                f"{self.req.out} holds a {'dry' if doc['dry_run'] else 'real'} suite; "
                "give another --out"
            )
        earlier = doc.get("preflight")
        if isinstance(earlier, dict) and earlier.get("ok") is True:
            self.preflight_doc = {**earlier, "earlier": True}
        for old in doc["steps"]:
            self.resume_step(plan, old)
        self.resume_rows()

    def resume_step(self, plan: Path, old: Any) -> None:
        steps = {s.name: s for s in self.catalogue}
        try:
            name, status = old["step"]["name"], old["status"]
            if status != "done" or name not in steps:
                return
            selected = name in self.by_name
            p = self.by_name[name] if selected else Planned(steps[name])
            p.out, p.outputs, p.seconds = str(old["out"]), dict(old["outputs"]), old["seconds"]
            p.job, p.base_s, p.kind = (
                str(old.get("job", "")),
                old.get("base_s"),
                old.get("kind", ""),
            )
            why = outputs_intact(p)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"{plan} is damaged ({type(e).__name__}: {e})") from None
        if why:
            self.log(
                f"{name}: not trusted as done ({why})" + (": it runs again" if selected else "")
            )
            p.out, p.outputs, p.seconds = None, {}, None
            return
        if not selected:
            self.keep(p)
        p.status = "done"

    def keep(self, p: Planned) -> None:
        """A step an earlier call finished but this one did not select: kept
        (with its rows), in the catalogue's order, never run again here."""
        order = {s.name: i for i, s in enumerate(self.catalogue)}
        self.planned.append(p)
        self.planned.sort(key=lambda q: order[q.step.name])
        self.by_name[p.step.name] = p

    def resume_rows(self) -> None:
        done = [p for p in self.planned if p.status == "done"]
        path = self.req.out / "rows.json"
        kept: list[dict[str, Any]] = []
        if path.exists():
            names = {p.step.name for p in done}
            kept = [
                r for r in read_json(path, list) if isinstance(r, dict) and r.get("step") in names
            ]
        elif done:
            self.log(
                f"{path} is missing: the rows are rebuilt from the finished steps' directories"
            )
        have = {r["step"] for r in kept}
        for p in done:
            if p.step.name not in have:
                kept += self.rows_of(p)
        order = {p.step.name: i for i, p in enumerate(self.planned)}
        self.rows = sorted(kept, key=lambda r: order[r["step"]])
        if done:
            self.log(f"going on from {self.req.out / 'plan.json'}: {len(done)} step(s) done")

    def rows_of(self, p: Planned) -> list[dict[str, Any]]:
        assert p.out is not None
        return step_rows(p.step, Path(p.out), self.command(p.step), dry_run=self.req.dry_run)

    # ------------------------------------------------------------------ preflight, rates
    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

    def preflight(self, check: Preflight) -> None:
        """Prove the GPU path before any step (:mod:`osfl.suite.preflight`);
        a failure is written to ``plan.json`` and the bundle, then raised."""
        mode = self.req.preflight
        if mode == "auto":
            mode = "imports" if self.req.dry_run else "all"
        if mode == "none":
            self.preflight_doc = {"ok": None, "mode": "none"}
            return
        if self.preflight_doc.get("earlier") and self.preflight_doc.get("mode") in (mode, "all"):
            self.log("preflight: passed in an earlier call into this directory")
            return
        t0 = self.clock()
        scripts = [s.argv[1] for s in self.catalogue if s.kind == "script"]
        try:
            report = check(mode, scripts)
        except PreflightError as e:
            self.preflight_doc = {
                "ok": False,
                "mode": mode,
                **e.details,
                "seconds": self.clock() - t0,
            }
            self.log(str(e))
            self.write()
            raise
        seconds = self.clock() - t0
        self.preflight_doc = {"ok": True, "mode": mode, **report, "seconds": seconds}
        self.overheads["preflight_s"] = seconds
        ran = len(report.get("methods", []))
        self.log(
            f"preflight ({mode}): {len(report.get('imports', []))} imports"
            + (f", {ran} methods on {report.get('device')}" if ran else "")
            + f" in {seconds:.0f} s"
            + (
                f"; not reached: {', '.join(report['not_reached'])}"
                if report.get("not_reached")
                else ""
            )
        )

    def measure(self, measure: Measure) -> float:
        """This machine's rates: given, kept from an earlier call of the same
        kind (real or dry), or measured now (its time counts)."""
        t0 = self.clock()
        path = self.req.out / "rates.json"
        if self.req.rates is not None:
            self.rates = check_rates(self.req.rates, "the given rates")
        else:
            old = read_rates(path)
            if old is not None and bool(old.get("tiny")) == self.req.dry_run:
                self.rates = old
                self.log(f"rates from {path}")
            else:
                self.rates = check_rates(measure(tiny=self.req.dry_run), "the measured rates")
        atomic_write(path, json.dumps(self.rates, indent=2) + "\n")
        shown = ", ".join(f"{k} {v:.4g}" for k, v in self.rates.items() if isinstance(v, float))
        self.log(f"rates ({self.rates.get('machine', '?')}): {shown}")
        self.overheads["rates_s"] = self.clock() - t0
        return self.overheads["rates_s"]

    # ------------------------------------------------------------------ plan
    def pricing(self) -> Pricing:
        assert self.rates is not None
        return Pricing(self.rates, self.learned, dry_run=self.req.dry_run)

    def estimate(self) -> None:
        """Every pending step's estimate (work over the rates, times its
        learned factor); a step whose rows are already in the repository is
        not run again, nor the encoder the repository holds."""
        pricing = self.pricing()
        for p in (p for p in self.planned if p.status == "pending"):
            p.base_s = pricing.base(p.step)
            p.factor, p.factor_from = pricing.factor(p.step)
            p.kind = pricing.kind(p.step)
            p.estimate_s = p.base_s * p.factor
        in_repo = {} if self.req.dry_run else rows_in_repo(self.req.repo)
        copy = None if self.encoder_copy is None else str(self.encoder_copy)
        mark_in_repo(self.planned, in_repo, encoder=copy, keep=self.req.step_names)

    def plan(self) -> None:
        """Place the pending steps in this command (all but the reserve of its
        budget, less what the preflight and rates took) and the lease's later
        one (``then_min``); "out of reach" against a fresh lease's commands."""
        assert self.rates is not None
        caps = [max(0.0, plannable_s(self.budget_s) - (self.clock() - self.start))]
        if self.req.then_min > 0:
            caps.append(plannable_s(command_budget_s(self.req.then_min)))
        preflight_s = self.overheads["preflight_s"] or self.learned.preflight_s
        fresh = lease_capacities(COMMAND_MINUTES, first_overhead_s(self.rates, preflight_s))
        fresh[0] = max(fresh[0], caps[0])  # a command longer than a lease's first
        self.capacities = {"this_lease": caps, "fresh_lease": fresh}
        make_plan(
            self.planned, caps, fresh=fresh, forced=sorted(self.forced), reach=self.pricing().reach
        )

    # ------------------------------------------------------------------ run
    def encoder(self) -> Path:
        """The encoder the steps read: the repository's copy unless this call
        trains one."""
        p = self.by_name.get(ENCODER_STEP)
        if self.encoder_copy is not None and (p is None or p.status == "in_repo"):
            return self.encoder_copy.resolve()
        return self.req.out / "runs" / ENCODER_STEP / ENCODER

    def command(self, step: Step) -> list[str]:
        argv = step.command(dry_run=self.req.dry_run)
        values = {"out": self.req.out / "runs" / step.name, "encoder": self.encoder()}
        return resolve(argv, values)

    def execute(self, argv: Sequence[str]) -> tuple[bool, float, str]:
        """Run one command; a failure is recorded, an interrupt stops the suite."""
        t0 = self.clock()
        try:
            rc = self.run_script(argv[1:]) if argv[0] == "script" else self.run_command(argv)
            ok, why = rc == 0, "" if rc == 0 else f"exit status {rc}"
        except SystemExit as e:
            if e.code == 130:  # osfl's own answer to Ctrl-C: the suite stops too
                raise KeyboardInterrupt from None
            ok, why = False, f"exit status {e.code}"
        except Exception as e:  # a step's failure is recorded, the suite goes on
            ok, why = False, f"{type(e).__name__}: {e}"
            self.log(traceback.format_exc())
        finally:
            free_gpu()
        return ok, self.clock() - t0, why

    def run_one(self, p: Planned) -> None:
        argv = self.command(p.step)
        p.out = str(self.req.out / "runs" / p.step.name)
        fresh_dir(Path(p.out))  # what a killed call left of this step is not reused
        self.log(
            f"running {p.step.name} (estimate {p.estimate_s or 0:.0f} s): {command_text(argv)}"
        )
        self.current, p.job = (p, self.clock()), self.started
        ok, p.seconds, why = self.execute(argv)
        self.current = None
        if ok and p.step.post:
            POSTPROCESS[p.step.post](Path(p.out))
        p.status, p.reason = ("done", "") if ok else ("failed", why)
        if ok:
            p.outputs = output_hashes(Path(p.out))
            self.rows += self.rows_of(p)
        self.log(f"{p.step.name}: {p.status} in {p.seconds:.0f} s" + (f" ({why})" if why else ""))

    def run_planned(self) -> None:
        for p in self.planned:
            if p.status != "planned":
                continue
            failed = [n for n in p.step.needs if self.by_name[n].status not in ("done", "in_repo")]
            forced = p.step.name in self.forced
            if failed:
                p.status, p.reason = "skipped", f"needs {', '.join(failed)}, which did not finish"
            elif not forced and p.estimate_s is not None and p.estimate_s > self.left():
                p.status = "skipped"
                p.reason = f"estimate {p.estimate_s:.0f} s > {self.left():.0f} s left"
            else:
                try:
                    self.run_one(p)
                except KeyboardInterrupt:
                    self.interrupted(p)
                    raise
            self.write()

    def interrupted(self, p: Planned) -> None:
        """Ctrl-C (or the job's timeout) during ``p``: it ran this long (what
        the next plan learns from); no further step runs."""
        p.status, p.reason = "failed", "interrupted (Ctrl-C or the job's time limit)"
        if self.current is not None:
            p.seconds = self.clock() - self.current[1]
        for q in self.planned:
            if q.status in ("planned", "later"):
                q.status, q.reason = "skipped", "the suite was interrupted"
        self.log(f"{p.step.name}: interrupted after {p.seconds or 0:.0f} s; no further step runs")
        self.write()

    # ------------------------------------------------------------------ write
    def write(self) -> None:
        out = self.req.out
        doc = {
            "budget_min": self.req.budget_min,
            "then_min": self.req.then_min,
            "dry_run": self.req.dry_run,
            "started": self.started,
            "elapsed_s": self.clock() - self.start,
            "machine": (self.rates or {}).get("machine"),
            "preflight": self.preflight_doc,
            "overheads": self.overheads,
            "capacities": self.capacities,
            "learned": {"steps": dict(self.learned.steps), "kinds": dict(self.learned.kinds)},
            "steps": [p.as_dict() for p in self.planned],
        }
        markdown = rows_markdown(self.rows, self.planned)
        atomic_write(out / "plan.json", json.dumps(doc, indent=2) + "\n")
        atomic_write(out / "rows.json", json.dumps(self.rows, indent=2) + "\n")
        atomic_write(out / "reproduction_gpu.md", markdown)
        done = [p for p in self.planned if p.out and p.status == "done"]
        members = archive_members({p.step.name: Path(p.out) for p in done}, [out / "suite.log"])
        returned = [Path(p.out) / f for p in done for f in p.step.returns]  # type: ignore[arg-type]
        bundle = self.req.bundle or out / "bundle"
        write_bundle(
            bundle,
            plan=doc,
            rows=self.rows,
            markdown=markdown,
            rates=self.rates,
            members=members,
            files=returned,
        )


def run_suite(
    req: SuiteRequest,
    run_command: RunCommand,
    *,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
    measure: Measure = measure_rates,
    script: RunCommand = run_script,
    preflight: Preflight | None = None,
) -> SuiteResult:
    """Prove the GPU path, measure this machine's rates, plan the steps that
    fit this command and the lease's later one (the preflight and the
    measurement included), run this command's in order of value, write the
    rows and the bundle after every step. ``run_command`` runs an osfl
    command, ``script`` a ``script`` step's benchmark script, ``preflight``
    the checks before any step (default :func:`run_preflight`). Nothing is
    written before the request is checked (sections, steps, minutes)."""
    check_budget(req.budget_min)
    check_budget(req.then_min, what="the later command", zero=True)
    if req.preflight not in PREFLIGHT_MODES:
        raise ConfigError(f"preflight must be one of {', '.join(PREFLIGHT_MODES)}")
    select_steps(
        req.sections, list(req.steps) if req.steps is not None else STEPS, names=req.step_names
    )
    req.out.mkdir(parents=True, exist_ok=True)
    use_pack(req.pack_dir, log)
    suite = _Suite(req, run_command, clock, log, script)
    suite.preflight(preflight or run_preflight)
    rates_s = suite.measure(measure)
    suite.estimate()
    suite.plan()
    suite.write()
    for p in suite.planned:
        suite.log(f"plan: {p.step.name}: {p.status}" + (f" ({p.reason})" if p.reason else ""))
    suite.run_planned()
    suite.write()
    return SuiteResult(suite.planned, suite.rows, rates_s, clock() - suite.start)
