"""``osfl suite run``: calibrate, plan within the budget, run in order of
value, and write the REPRODUCTION rows of what finished (issue #32).

The commands run in this process through the ``run_command`` the CLI hands
in (``osfl.cli.main``: the very code path of ``osfl run`` / ``osfl
pretrain``), each into its own directory; a step that fails is recorded with
its error and the suite goes on. Written under the suite's directory:

- ``plan.json``: every step with its calibration seconds, estimate, status
  (``planned`` / ``skipped`` and why / ``done`` / ``failed``) and seconds,
  rewritten after every step;
- ``calibration/<step>/`` and ``runs/<step>/``: each command's own output
  (a run directory, an encoder with its card, ``mfu.json``);
- ``reproduction_gpu.md`` and ``rows.json``: one row per method and setting
  of every finished step (paper number, ours with the per-seed values, scale,
  the exact command), rewritten after every step, so a machine taken back
  mid-suite leaves the rows of what finished. The rows are for a person to
  move into REPRODUCTION.md, under the section's ``gpu`` heading, never next
  to the cpu rows; a dry run's rows say ``dry-run`` as their scale.

A second call into the same directory goes on from the first (a lent
machine runs one command for at most 10 minutes: ``osfl suite run --budget 9``
again and again): finished steps and their rows are kept, calibrations
reused, and what a killed call left of an unfinished step is removed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfl.errors import ConfigError
from osfl.suite.pack import read_manifest, unpack_imagefolder
from osfl.suite.plan import ENCODER, MEASURED_MARGIN, Planned, Step, make_plan, select_steps

RunCommand = Callable[[Sequence[str]], int]


@dataclass
class SuiteRequest:
    out: Path
    budget_min: float
    sections: Sequence[str] = ()
    dry_run: bool = False
    pack_dir: Path | None = None
    unpack_dir: Path = Path(".osfl_cache/gpu_pack")
    steps: Sequence[Step] | None = None  # the catalogue's (tests pass their own)
    machine: str | None = None  # the GPU's name (None: this machine's, if it has one)


@dataclass
class SuiteResult:
    planned: list[Planned]
    rows: list[dict[str, Any]] = field(default_factory=list)
    calibration_s: float = 0.0
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


def _resolve(argv: Sequence[str], out: Path, encoder: Path) -> list[str]:
    return [a.replace("{out}", str(out)).replace("{encoder}", str(encoder)) for a in argv]


def use_pack(pack_dir: Path | None, unpack_dir: Path, log: Callable[[str], None]) -> None:
    """Point ``OSFL_CIFAR10`` at the packed image folder (unpacked once)
    unless it already names a folder that exists."""
    if pack_dir is None:
        return
    manifest = read_manifest(pack_dir)
    if manifest is None:
        raise ConfigError(f"{pack_dir} holds no pack (no MANIFEST.json): run `osfl suite pack`")
    if "cifar10.npz" not in manifest["files"]:
        return
    current = os.environ.get("OSFL_CIFAR10")
    if current and Path(current).is_dir():
        log(f"OSFL_CIFAR10={current} exists: the pack's copy is not used")
        return
    root = unpack_imagefolder(pack_dir / "cifar10.npz", unpack_dir / "cifar10")
    os.environ["OSFL_CIFAR10"] = str(root)
    log(f"OSFL_CIFAR10={root} (unpacked from {pack_dir / 'cifar10.npz'})")


#: The least time a calibration may have (it runs a short form of its step:
#: CUDA's start, data loading, a few epochs).
CALIBRATION_MIN_S = 60.0


def _gpu_name() -> str | None:
    # heavy: torch, only to name the GPU whose measured step costs apply
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _free_gpu() -> None:
    # heavy: torch, only to hand a finished step's cached GPU memory back
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Suite:
    def __init__(self, req: SuiteRequest, run_command: RunCommand, clock: Callable[[], float],
                 log: Callable[[str], None]):  # fmt: skip
        self.req, self.run_command, self.clock, self.log = req, run_command, clock, log
        self.start = clock()
        self.budget_s = 60.0 * req.budget_min
        steps = select_steps(req.sections, *([req.steps] if req.steps is not None else []))
        self.planned = [Planned(s) for s in steps]
        self.by_name = {p.step.name: p for p in self.planned}
        self.rows: list[dict[str, Any]] = []
        self.resume()

    def resume(self) -> None:
        """Go on from an earlier call into the same directory (a lent machine
        runs one command for at most 10 minutes): its finished steps and their
        rows are kept, its calibrations reused."""
        plan, rows = self.req.out / "plan.json", self.req.out / "rows.json"
        if not plan.is_file():
            return
        doc = json.loads(plan.read_text())
        if doc.get("dry_run") != self.req.dry_run:
            raise ConfigError(
                f"{self.req.out} holds a {'dry' if doc.get('dry_run') else 'real'} suite; "
                "give another --out"
            )
        for old in doc["steps"]:
            p = self.by_name.get(old["step"]["name"])
            if p is None:
                continue
            p.calibration_s, p.estimate_s = old["calibration_s"], old["estimate_s"]
            p.estimate_from = old.get("estimate_from", "")
            if old["status"] == "done":
                p.status, p.seconds, p.out = "done", old["seconds"], old["out"]
        done = {p.step.name for p in self.planned if p.status == "done"}
        if rows.is_file():
            self.rows = [r for r in json.loads(rows.read_text()) if r["step"] in done]
        if done or any(p.calibration_s is not None for p in self.planned):
            self.log(f"going on from {plan}: {len(done)} step(s) done")

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

    def encoder(self, phase: str) -> Path:
        """The encoder a command of ``phase`` reads: the calibration's own,
        or, once the encoder step has run, that step's."""
        done = self.by_name.get("pretrain_vits16")
        if phase == "calibration" and done is not None and done.status == "done":
            phase = "runs"
        return self.req.out / phase / "pretrain_vits16" / ENCODER

    def command(self, step: Step, phase: str) -> list[str]:
        argv = list(step.command(dry_run=self.req.dry_run))
        if phase == "calibration":
            argv = with_overrides(step, argv, step.calibration(dry_run=self.req.dry_run))
        return _resolve(argv, self.req.out / phase / step.name, self.encoder(phase))

    def execute(self, argv: Sequence[str]) -> tuple[bool, float, str]:
        t0 = self.clock()
        try:
            rc = self.run_command(argv)
            ok, why = rc == 0, "" if rc == 0 else f"exit status {rc}"
        except SystemExit as e:
            ok, why = False, f"exit status {e.code}"
        except Exception as e:  # a step's failure is recorded, the suite goes on
            ok, why = False, f"{type(e).__name__}: {e}"
            self.log(traceback.format_exc())
        finally:
            _free_gpu()
        return ok, self.clock() - t0, why

    def calibrate(self) -> float:
        """Estimate every step: first from its cost measured on a machine like
        this one where there is one (a calibration's fixed costs, scaled by the
        step's ratio, overestimate a short lease's steps many times: 30 s of
        calibration, 8 s of it training, for a 360-s encoder step), then, for
        the rest, from a calibration run, but only while the budget still
        holds the measured steps plus :data:`CALIBRATION_MIN_S`: calibrating
        cheap later steps must not crowd out the valuable measured ones."""
        t0 = self.clock()
        machine = None if self.req.dry_run else self.req.machine or _gpu_name()
        pending = [p for p in self.planned if p.status != "done" and p.calibration_s is None]
        reserved = 0.0
        for p in pending:
            measured = None if machine is None else p.step.measured(machine)
            if measured is not None:
                p.calibration_s, p.estimate_s = 0.0, measured
                p.estimate_from = f"{p.step.measured_note} (x{MEASURED_MARGIN})"
                reserved += measured
                self.log(f"{p.step.name}: estimate {measured:.0f} s, {p.estimate_from}")
        for p in (p for p in pending if p.calibration_s is None):
            self.calibrate_one(p, reserved)
        return self.clock() - t0

    def calibration_can_read(self, name: str) -> bool:
        """Whether step ``name`` left an output a calibration can read: its
        finished run, or its own calibration run (a measured step has none)."""
        q = self.by_name.get(name)
        return q is not None and (q.status == "done" or q.estimate_from == "calibration")

    def calibrate_one(self, p: Planned, reserved: float) -> None:
        """Run ``p``'s calibration, unless what it reads or the time is missing."""
        bad = [n for n in p.step.needs if not self.calibration_can_read(n)]
        if bad:  # a measured step leaves no calibration output to read: a later call
            p.status = "skipped"
            p.reason = f"needs {', '.join(bad)}'s output: calibrated in a call after it has run"
            return
        if self.left() - reserved < CALIBRATION_MIN_S:
            p.status = "skipped"
            p.reason = f"no time to calibrate beside the measured steps' {reserved:.0f} s"
            return
        argv = self.command(p.step, "calibration")
        _fresh(self.req.out / "calibration" / p.step.name)
        self.log(f"calibrating {p.step.name}: osfl {shlex.join(argv)}")
        ok, seconds, why = self.execute(argv)
        if not ok:
            p.status, p.reason = "failed", f"calibration failed: {why}"
            return
        p.calibration_s = seconds
        p.estimate_s = seconds * p.step.work_ratio(dry_run=self.req.dry_run)
        p.estimate_from = "calibration"
        self.log(f"  {seconds:.1f} s -> estimate {p.estimate_s:.0f} s")

    def run_planned(self) -> None:
        for p in self.planned:
            if p.status != "planned":
                continue
            failed = [n for n in p.step.needs if self.by_name[n].status != "done"]
            if failed:
                p.status, p.reason = "skipped", f"needs {', '.join(failed)}, which did not finish"
            elif p.estimate_s is not None and p.estimate_s > self.left():
                p.status = "skipped"
                p.reason = f"estimate {p.estimate_s:.0f} s > {self.left():.0f} s left"
            else:
                argv = self.command(p.step, "runs")
                p.out = str(self.req.out / "runs" / p.step.name)
                _fresh(Path(p.out))  # what a killed call left of this step is not reused
                self.log(f"running {p.step.name} (estimate {p.estimate_s:.0f} s): "
                         f"osfl {shlex.join(argv)}")  # fmt: skip
                ok, p.seconds, why = self.execute(argv)
                p.status, p.reason = ("done", "") if ok else ("failed", why)
                if ok:
                    self.rows += step_rows(p.step, Path(p.out), argv, dry_run=self.req.dry_run)
            self.write()

    def write(self) -> None:
        out = self.req.out
        doc = {
            "budget_min": self.req.budget_min,
            "dry_run": self.req.dry_run,
            "elapsed_s": self.clock() - self.start,
            "steps": [p.as_dict() for p in self.planned],
        }
        _atomic(out / "plan.json", json.dumps(doc, indent=2) + "\n")
        _atomic(out / "rows.json", json.dumps(self.rows, indent=2) + "\n")
        _atomic(out / "reproduction_gpu.md", rows_markdown(self.rows, self.planned))


def _fresh(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_suite(
    req: SuiteRequest,
    run_command: RunCommand,
    *,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
) -> SuiteResult:
    """Calibrate every selected step, plan those that fit ``req.budget_min``
    (calibration included), run them in order of value, write the rows."""
    if req.budget_min <= 0:
        raise ConfigError(f"the budget must be a positive number of minutes, got {req.budget_min}")
    req.out.mkdir(parents=True, exist_ok=True)
    use_pack(req.pack_dir, req.unpack_dir, log)
    suite = _Suite(req, run_command, clock, log)
    suite.write()
    calibration_s = suite.calibrate()
    make_plan(suite.planned, suite.left())
    suite.write()
    for p in suite.planned:
        log(f"plan: {p.step.name}: {p.status}" + (f" ({p.reason})" if p.reason else ""))
    suite.run_planned()
    suite.write()
    return SuiteResult(suite.planned, suite.rows, calibration_s, clock() - suite.start)


# --------------------------------------------------------------------------- rows
def step_rows(step: Step, out: Path, argv: Sequence[str], *, dry_run: bool) -> list[dict[str, Any]]:
    """The rows of a finished step: one per method and grid point (runs),
    one for an encoder or a benchmark."""
    common = {
        "section": step.section,
        "step": step.name,
        "scale": "dry-run" if dry_run else "gpu",
        "scale_note": step.scale_note,
        "paper_note": step.paper_note,
        "command": "osfl " + shlex.join(argv),
    }
    if step.kind == "pretrain":
        card = json.loads((out / ENCODER.replace(".safetensors", ".card.json")).read_text())
        acc = card["results"]["held_out"].get("accuracy")
        ours = None if acc is None else 100 * acc
        env = card.get("training", {}).get("environment") or card.get("provenance", {})
        return [{**common, "method": "encoder (held-out accuracy)", "setting": "",
                 "paper": None, "ours": ours, "per_seed": [ours], "provenance": env}]  # fmt: skip
    if step.kind == "mfu":
        m = json.loads((out / "mfu.json").read_text())
        ours = None if m["mfu"] is None else 100 * m["mfu"]
        return [{**common, "method": f"MFU {m['model']} {m['dtype']}", "setting": f"batch {m['batch']}",
                 "paper": step.paper.get("mfu"), "ours": ours, "per_seed": [ours],
                 "achieved_tflops": m["achieved_tflops"], "provenance": m["provenance"]}]  # fmt: skip
    # heavy: torch (osfl.report), only once a step has finished
    from osfl.report import mean_std_text

    records = json.loads((out / "metrics.json").read_text())["records"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["method"], r.get("point", "")), []).append(r)
    rows = []
    for (method, point), recs in groups.items():
        recs.sort(key=lambda r: r["seed"])
        accs = [100 * r["global_test_accuracy"] for r in recs]
        rows.append({**common, "method": method, "setting": point, "paper": step.paper.get(method),
                     "ours": statistics.mean(accs), "ours_text": mean_std_text(accs),
                     "seeds": [r["seed"] for r in recs], "per_seed": accs,
                     "provenance": recs[0].get("provenance", {})})  # fmt: skip
    return rows


def _machine(rows: Sequence[dict[str, Any]]) -> str:
    for r in rows:
        p = r.get("provenance") or {}
        if p.get("gpu"):
            return (f"{p['gpu']}, driver {p.get('cuda_driver')}, CUDA {p.get('cuda')}, "
                    f"torch {p.get('torch')}, dtype {p.get('dtype', 'see record')}")  # fmt: skip
    p = rows[0].get("provenance") or {} if rows else {}
    return f"no GPU (device {p.get('device', 'cpu')}, torch {p.get('torch')})"


def rows_markdown(rows: Sequence[dict[str, Any]], planned: Sequence[Planned]) -> str:
    """``reproduction_gpu.md``: the rows by section, then what did not run."""
    lines = [
        "# osfl suite: rows for REPRODUCTION.md (scale gpu: keep them apart from cpu rows)",
        "",
    ]
    lines.append(f"Machine: {_machine(rows)}.")
    for section in dict.fromkeys(r["section"] for r in rows):
        lines += ["", f"## {section}", ""]
        lines.append("| step | method | setting | paper | ours | seeds (per seed) | scale |")
        lines.append("|---|---|---|---:|---:|---|---|")
        commands: dict[str, str] = {}
        for r in (r for r in rows if r["section"] == section):
            paper = "—" if r["paper"] is None else f"{r['paper']:.2f}"
            ours = r.get("ours_text") or ("—" if r["ours"] is None else f"{r['ours']:.2f}")
            seeds = ", ".join(
                f"{s}: {v:.2f}" if v is not None else f"{s}: —"
                for s, v in zip(
                    r.get("seeds", [0] * len(r["per_seed"])), r["per_seed"], strict=True
                )
            )
            lines.append(f"| {r['step']} | {r['method']} | {r['setting']} | {paper} | {ours} | "
                         f"{seeds} | {r['scale']} |")  # fmt: skip
            commands[r["step"]] = r["command"]
        lines.append("")
        lines += [f"- `{step}`: `{cmd}`" for step, cmd in commands.items()]
        notes = {(r["paper_note"], r["scale_note"]) for r in rows if r["section"] == section}
        for paper_note, scale_note in sorted(notes):
            lines.append(f"\nPaper: {paper_note}. Ours: {scale_note}.")
    lines += ["", "## Not run", ""]
    rest = [p for p in planned if p.status != "done"]
    lines += [f"- {p.step.name}: {p.status} ({p.reason})" for p in rest] or ["- nothing"]
    return "\n".join(lines) + "\n"
