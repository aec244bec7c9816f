"""``osfl suite run``: measure, plan within the budget, run in order of
value, and hand back the rows of what finished (issues #32, #40).

The commands run in this process through the ``run_command`` the CLI hands
in (``osfl.cli.main``: the very code path of ``osfl run`` / ``osfl
pretrain``; a ``script`` step's benchmark script runs through its own
``main``), each into its own directory; a step that fails is recorded with
its error and the suite goes on; Ctrl-C (or the job's inner timeout, which
sends SIGINT) stops it: the step is marked ``failed`` (interrupted), the
plan written, no further step run, exit status 130. Written under the
suite's directory:

- ``rates.json``: the measured rates (:mod:`osfl.suite.rates`), reused by a
  later call into the same directory;
- ``plan.json``: every step with its estimate, status (``planned`` /
  ``skipped`` and why / ``done`` / ``failed`` / ``in_repo``), seconds and the
  sha256 of its outputs, rewritten after every step;
- ``runs/<step>/``: each command's own output;
- ``rows.json`` and ``reproduction_gpu.md``: one row per method and setting
  of every finished step (:mod:`osfl.suite.rows`), rewritten after every step;
- ``suite.log``: what the suite printed;
- the bundle (:mod:`osfl.suite.bundle`; ``--bundle``, default
  ``<out>/bundle``): all of that, flat, within a lent machine's return
  limits, rewritten after every finished step.

A second call into the same directory goes on from the first (steps it
finished stay in the plan and the rows even when this call selects others):
a step is "done" only while every output it finished with still has its sha256;
``rows.json``, if missing, is rebuilt from the done steps' directories; a
damaged ``plan.json`` or ``rows.json`` is one error line (exit 2). Steps
whose rows are already in the repository (``reproduction/gpu_suite_*.json``,
written by ``osfl suite import``) are not run again.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import shutil
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError, DataError
from osfl.suite.bundle import archive_members, read_json, write_bundle
from osfl.suite.catalogue import STEPS
from osfl.suite.pack import packed_imagefolder, sha256_file
from osfl.suite.plan import Planned, make_plan, select_steps
from osfl.suite.rates import check_rates, measure_rates, read_rates
from osfl.suite.rows import rows_markdown, step_rows
from osfl.suite.steps import ENCODER, Step, command_text

RunCommand = Callable[[Sequence[str]], int]
Measure = Callable[..., dict[str, Any]]


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
    #: the repository whose ``reproduction/gpu_suite_*.json`` rows are not re-run
    repo: Path | None = None


@dataclass
class SuiteResult:
    planned: list[Planned]
    rows: list[dict[str, Any]] = field(default_factory=list)
    rates_s: float = 0.0
    wall_s: float = 0.0


def with_overrides(step: Step, argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``argv`` with ``extra`` added where they take effect: key=value
    overrides before the first option (argparse reads one run of
    positionals), the benchmark's options at the end (the last one wins)."""
    argv = list(argv)
    if step.kind == "mfu":
        return [*argv, *extra]
    at = next((i for i, a in enumerate(argv) if i > 0 and a.startswith("--")), len(argv))
    return [*argv[:at], *extra, *argv[at:]]


def _resolve(argv: Sequence[str], values: Mapping[str, Path]) -> list[str]:
    out = []
    for a in argv:
        for key, value in values.items():
            a = a.replace("{" + key + "}", str(value))
        out.append(a)
    return out


def use_pack(pack_dir: Path | None, log: Callable[[str], None]) -> None:
    """Point ``OSFL_CIFAR10`` at the pack's image file (checked, read in
    memory by ``imagefolder:<file>.npz``) unless it already names a path
    that exists."""
    if pack_dir is None:
        return
    path = packed_imagefolder(pack_dir)
    if path is None:
        return
    current = os.environ.get("OSFL_CIFAR10")
    if current and Path(current).exists():
        log(f"OSFL_CIFAR10={current} exists: the pack's copy is not used")
        return
    os.environ["OSFL_CIFAR10"] = str(path)
    log(f"OSFL_CIFAR10={path} (the pack, read in memory)")


def _free_gpu() -> None:
    # heavy: torch, only to hand a finished step's cached GPU memory back
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_script(argv: Sequence[str]) -> int:
    """A ``script`` step: ``PATH ARGS...``, the benchmark script's own
    ``main(ARGS)`` in this process (no new Python, no second CUDA start)."""
    path, *args = argv
    if not Path(path).is_file():
        raise ConfigError(f"{path} does not exist (run the suite from the repository root)")
    module = runpy.run_path(path, run_name="osfl_suite_script")
    rc = module["main"](list(args))
    return 0 if rc is None else int(rc)


def output_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under a finished step's directory, by relative path."""
    return {
        str(f.relative_to(root)): sha256_file(f) for f in sorted(root.rglob("*")) if f.is_file()
    }


def outputs_intact(p: Planned) -> str:
    """Why ``p``'s outputs can no longer be trusted ("" when they all match)."""
    if p.out is None or not p.outputs:
        return "no outputs recorded"
    root = Path(p.out)
    for rel, digest in p.outputs.items():
        f = root / rel
        if not f.is_file():
            return f"{f} is missing"
        if sha256_file(f) != digest:
            return f"{f} changed since the step finished"
    return ""


def rows_in_repo(repo: Path | None) -> dict[str, str]:
    """Step name -> the file of ``repo/reproduction/`` that already holds its
    rows (written by ``osfl suite import``)."""
    if repo is None:
        return {}
    found: dict[str, str] = {}
    for f in sorted((repo / "reproduction").glob("gpu_suite_*.json")):
        for entry in read_json(f, list):
            for name in entry.get("steps", []) if isinstance(entry, dict) else []:
                found[name] = f"reproduction/{f.name}"
    return found


class _Suite:
    def __init__(self, req: SuiteRequest, run_command: RunCommand, clock: Callable[[], float],
                 log: Callable[[str], None], script: RunCommand = run_script):  # fmt: skip
        self.req, self.run_command, self.clock = req, run_command, clock
        self.run_script = script
        self._print = log
        self.start = clock()
        self.budget_s = 60.0 * req.budget_min
        self.catalogue = list(req.steps) if req.steps is not None else list(STEPS)
        steps = select_steps(req.sections, self.catalogue, names=req.step_names)
        #: ``--steps``: the named steps and what they need run whatever their estimates
        self.forced = {s.name for s in steps} if req.step_names else set()
        self.planned = [Planned(s) for s in steps]
        self.by_name = {p.step.name: p for p in self.planned}
        self.rows: list[dict[str, Any]] = []
        self.rates: dict[str, Any] | None = None
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
        when ``rows.json`` is missing."""
        plan = self.req.out / "plan.json"
        if not plan.is_file():
            return
        doc = read_json(plan, dict)
        if not isinstance(doc.get("steps"), list) or "dry_run" not in doc:
            raise DataError(f"{plan} is damaged (no steps or dry_run); remove it to start again")
        if doc["dry_run"] != self.req.dry_run:
            raise ConfigError(
                f"{self.req.out} holds a {'dry' if doc['dry_run'] else 'real'} suite; "
                "give another --out"
            )
        steps = {s.name: s for s in self.catalogue}
        for old in doc["steps"]:
            try:
                name, status = old["step"]["name"], old["status"]
                if status != "done" or name not in steps:
                    continue
                selected = name in self.by_name
                p = self.by_name[name] if selected else Planned(steps[name])
                p.out, p.outputs, p.seconds = str(old["out"]), dict(old["outputs"]), old["seconds"]
                why = outputs_intact(p)
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{plan} is damaged ({type(e).__name__}: {e})") from None
            if why:
                self.log(
                    f"{name}: not trusted as done ({why})" + (": it runs again" if selected else "")
                )
                p.out, p.outputs, p.seconds = None, {}, None
                continue
            if not selected:
                self.keep(p)
            p.status = "done"
        self.resume_rows()

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
        if path.is_file():
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

    # ------------------------------------------------------------------ plan
    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

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
        _atomic(path, json.dumps(self.rates, indent=2) + "\n")
        shown = ", ".join(f"{k} {v:.4g}" for k, v in self.rates.items() if isinstance(v, float))
        self.log(f"rates ({self.rates.get('machine', '?')}): {shown}")
        return self.clock() - t0

    def estimate(self) -> None:
        """Every pending step's estimate at the measured rates; a step whose
        rows are already in the repository is not run again."""
        assert self.rates is not None
        in_repo = {} if self.req.dry_run else rows_in_repo(self.req.repo)
        pending = [p for p in self.planned if p.status == "pending"]
        for p in pending:
            p.estimate_s = p.step.estimate(self.rates, dry_run=self.req.dry_run)
        # a part of a row's clients (``feeds``) is done once that row is in the repository
        in_repo |= {p.step.name: in_repo[p.step.feeds] for p in pending if p.step.feeds in in_repo}
        skip = {p.step.name for p in pending if p.step.name in in_repo}
        skip -= set(self.req.step_names)  # what they need runs again anyway (below)
        # a step whose output another step still reads (the encoder) runs again:
        # its rows are in the repository, its weights are not on this machine
        skip -= {n for p in pending if p.step.name not in skip for n in p.step.needs}
        for p in pending:
            if p.step.name in skip:
                p.status, p.reason = "in_repo", f"its rows are in {in_repo[p.step.name]}"

    # ------------------------------------------------------------------ run
    def encoder(self) -> Path:
        return self.req.out / "runs" / "pretrain_vits16" / ENCODER

    def command(self, step: Step) -> list[str]:
        argv = step.command(dry_run=self.req.dry_run)
        values = {"out": self.req.out / "runs" / step.name, "encoder": self.encoder()}
        return _resolve(argv, values)

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
            _free_gpu()
        return ok, self.clock() - t0, why

    def run_one(self, p: Planned) -> None:
        argv = self.command(p.step)
        p.out = str(self.req.out / "runs" / p.step.name)
        _fresh(Path(p.out))  # what a killed call left of this step is not reused
        self.log(f"running {p.step.name} (estimate {p.estimate_s or 0:.0f} s): "
                 f"{command_text(argv)}")  # fmt: skip
        ok, p.seconds, why = self.execute(argv)
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
        """Ctrl-C (or the job's timeout) during ``p``: no further step runs."""
        p.status, p.reason = "failed", "interrupted (Ctrl-C or the job's time limit)"
        for q in self.planned:
            if q.status == "planned":
                q.status, q.reason = "skipped", "the suite was interrupted"
        self.log(f"{p.step.name}: interrupted; no further step runs")
        self.write()

    # ------------------------------------------------------------------ write
    def write(self) -> None:
        out = self.req.out
        doc = {
            "budget_min": self.req.budget_min,
            "dry_run": self.req.dry_run,
            "elapsed_s": self.clock() - self.start,
            "machine": (self.rates or {}).get("machine"),
            "steps": [p.as_dict() for p in self.planned],
        }
        markdown = rows_markdown(self.rows, self.planned)
        _atomic(out / "plan.json", json.dumps(doc, indent=2) + "\n")
        _atomic(out / "rows.json", json.dumps(self.rows, indent=2) + "\n")
        _atomic(out / "reproduction_gpu.md", markdown)
        dirs = {p.step.name: Path(p.out) for p in self.planned if p.out and p.status == "done"}
        members = archive_members(dirs, [out / "suite.log"])
        bundle = self.req.bundle or out / "bundle"
        write_bundle(bundle, plan=doc, rows=self.rows, markdown=markdown, rates=self.rates,
                     members=members)  # fmt: skip


def _fresh(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_budget(minutes: float) -> float:
    """``minutes`` if it is a finite positive number, else one error line."""
    if not (isinstance(minutes, int | float) and math.isfinite(minutes) and minutes > 0):
        raise ConfigError(f"the budget must be a positive, finite number of minutes, got {minutes}")
    return float(minutes)


def run_suite(
    req: SuiteRequest,
    run_command: RunCommand,
    *,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
    measure: Measure = measure_rates,
    script: RunCommand = run_script,
) -> SuiteResult:
    """Measure this machine's rates, plan the steps that fit
    ``req.budget_min`` (the measurement included), run them in order of
    value, write the rows and the bundle after every step. ``run_command``
    runs an osfl command, ``script`` a ``script`` step's benchmark script."""
    check_budget(req.budget_min)
    req.out.mkdir(parents=True, exist_ok=True)
    use_pack(req.pack_dir, log)
    suite = _Suite(req, run_command, clock, log, script)
    rates_s = suite.measure(measure)
    suite.estimate()
    make_plan(suite.planned, suite.left(), forced=sorted(suite.forced))
    suite.write()
    for p in suite.planned:
        suite.log(f"plan: {p.step.name}: {p.status}" + (f" ({p.reason})" if p.reason else ""))
    suite.run_planned()
    suite.write()
    return SuiteResult(suite.planned, suite.rows, rates_s, clock() - suite.start)
