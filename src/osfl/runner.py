"""``osfl run``'s work: every grid point of a config into one run directory.

Everything is planned first — configs of every grid point, data, federations,
methods and their ``check`` — so that a bad option or an incompatible method
stops the command before the run directory is made and before any client
trains. The directory is then made in one of three modes (``new``,
``overwrite``, ``resume``; :func:`osfl.rundir.prepare`), and ``metrics.json``
is rewritten atomically after every finished record, so an interrupted or
failed run keeps everything it finished and ``--resume DIR`` runs only the
records that are missing (same config, or it refuses). The trackers that
``logger`` names (:mod:`osfl.trackers`) see every round and record as the run
directory does, and the final table.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from osfl import report
from osfl.assembly import check_names, method_names
from osfl.code_version import code_version
from osfl.config import (
    ExperimentConfig,
    expand_sweeps,
    load_config,
    merge_sweeps,
    sweep_label,
    to_dict,
    to_yaml,
)
from osfl.errors import ConfigError, DataError
from osfl.experiment import Plan, execute_plan, plan_experiment, run_context
from osfl.fl.progress import Progress
from osfl.privacy.audit import audit_markdown
from osfl.record import RunRecord, typed
from osfl.rundir import RunDir
from osfl.trackers import RunInfo, SummaryTable, TrackerGroup, check_installed, round_scalars
from osfl.trackers.base import flatten
from osfl.trackers.group import IDS_FILE, read_ids


@dataclass
class RunRequest:
    """What ``osfl run`` was asked: a config file or several composed in
    order (``None``: the embedded default), overrides, extra sweep axes, the
    output directory, its mode."""

    config: str | Sequence[str] | None = None
    overrides: Sequence[str] = ()
    sweeps: Sequence[str] = ()
    out: str | None = None
    mode: str = "new"
    command: str = "osfl run"


def config_label(config: str | Sequence[str] | None) -> str:
    """The config files of a run, as its ``run_start`` event names them."""
    if config is None or not config:
        return "embedded default"
    return config if isinstance(config, str) else " + ".join(config)


@dataclass
class RunOutcome:
    base: ExperimentConfig
    out: Path
    records: list[RunRecord] = field(default_factory=list)
    wall_s: float = 0.0


Announce = Callable[[str], None]
BoardFactory = Callable[[bool], Progress]


def record_key(record: RunRecord) -> tuple[str, str, int]:
    """What identifies a record in a run: grid point, method, seed."""
    return (record.point, record.method, record.seed)


def _stored_config(out: Path) -> str:
    """The resolved config a run directory holds, read through today's schema:
    keys added to osfl since the run started take their defaults, so that an
    upgrade between the stop and the resume does not refuse an equal config."""
    try:
        return to_yaml(load_config(out / "config.yaml", []))
    except ConfigError as e:
        raise ConfigError(f"--resume {out}: its config.yaml does not load ({e})") from e


#: Config keys that change only where a run is shown or carried, never a
#: number: a resume may differ in them (``osfl run --resume DIR --no-progress``
#: of a run started with bars, with another ``logger``, or on another Ray
#: cluster with longer waits: ``flower_engine``).
DISPLAY_ONLY = ("progress", "logger", "flower_engine")


def _with_display_of(cfg: ExperimentConfig, stored: str) -> str:
    """``cfg`` as YAML with the display-only keys of the ``stored`` config, so
    that comparing the two sees the experiment alone."""
    kept = yaml.safe_load(stored) or {}
    same = {k: kept[k] for k in DISPLAY_ONLY if k in kept}
    for k, value in same.items():  # a section (flower_engine) back into its dataclass
        section = getattr(cfg, k)
        if dataclasses.is_dataclass(section) and isinstance(value, dict):
            same[k] = dataclasses.replace(section, **value)
    return to_yaml(dataclasses.replace(cfg, **same))


def config_differences(stored: str, given: str, most: int = 3) -> str:
    """Which keys two resolved configs (YAML) differ in, e.g. ``train.epochs
    (2 here, 1 in the run)``; at most ``most`` of them, then how many more."""
    a, b = flatten(yaml.safe_load(stored)), flatten(yaml.safe_load(given))
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _MISSING) != b.get(k, _MISSING)]
    shown = [
        f"{k} ({_show(b.get(k, _MISSING))} here, {_show(a.get(k, _MISSING))} in the run)"
        for k in keys[:most]
    ]
    more = f" and {len(keys) - most} more key(s)" if len(keys) > most else ""
    return ", ".join(shown) + more if shown else "its layout"


_MISSING = object()


def _show(value: Any) -> str:
    return "unset" if value is _MISSING else json.dumps(value, default=str)


def _finished(out: Path) -> list[RunRecord]:
    path = out / "metrics.json"
    if not path.exists() and not path.is_symlink():  # a FIFO or a device is read, and refused
        return []
    try:
        return list(report.read_metrics(path)["records"])
    except DataError as e:  # a damaged file is not resumed over
        raise DataError(f"{e}; cannot resume from it") from e


def check_same_clients(
    out: Path, done: Sequence[Mapping[str, Any]], plans: Sequence[tuple[Mapping[str, str], Plan]]
) -> None:
    """Refuse to resume ``out`` unless each finished record's clients are the
    plan's: the same config text does not make the same clients when a file
    it names (``partition.from_file``, an image folder) now holds other
    content. Compared: the record's partition key (it covers every client's
    indices) and the content hashes of its train and test sets
    (``provenance.data``). A record without them (older osfl) is not
    compared on them; a key from before the key covered the indices is
    accepted for a split drawn from its recipe, which fixes the indices."""
    now: dict[tuple[str, str, int], tuple[ExperimentConfig, Any]] = {}
    for point, plan in plans:
        for ctx, jobs in plan.seeds:
            for job in jobs:
                label = run_context(job.method.name, job.seed, point)["point"]
                now[(label, job.method.name, job.seed)] = (plan.cfg, ctx)
    for r in done:
        where = record_key(r)
        if where not in now:
            continue
        cfg, ctx = now[where]
        what = f"{where[1]} seed {where[2]}" + (f" at {where[0]}" if where[0] else "")
        why = _clients_differ(r, cfg, ctx)
        if why is not None:
            raise ConfigError(
                f"--resume {out}: {why} than {what} trained on; restore what the run started "
                "with, or start a new run"
            )


def _clients_differ(
    record: RunRecord | Mapping[str, Any], cfg: ExperimentConfig, ctx: Any
) -> str | None:
    """What of the plan's clients differs from ``record``'s (``None``: nothing)."""
    fed = ctx.federation
    (rec,) = typed([record])
    stored = (rec.partition or {}).get("key")
    if fed is not None and isinstance(stored, str):
        legacy = cfg.partition.from_file is None and stored == fed.recipe_key()
        if stored != fed.key() and not legacy:
            source = (
                f"partition.from_file={cfg.partition.from_file} now holds another split"
                if cfg.partition.from_file is not None
                else "the clients' split is another now"
            )
            return f"{source} (partition key {fed.key()}, {stored} in metrics.json)"
    data = (rec.provenance or {}).get("data")
    if ctx.splits is not None and isinstance(data, Mapping):
        for name in ("train", "test"):
            held = getattr(ctx.splits, name).fingerprint()
            if isinstance(data.get(name), str) and data[name] != held:
                return (
                    f"data.source={cfg.data.source} now holds other {name} images "
                    f"(content hash {held}, {data[name]} in metrics.json)"
                )
    return None


def plan_points(
    req: RunRequest, make_board: BoardFactory
) -> tuple[ExperimentConfig, Progress, list[tuple[Mapping[str, str], Plan]]]:
    """The resolved base config, the progress board (``make_board(config's
    progress)``) and every grid point's :class:`Plan`."""
    base = load_config(req.config, req.overrides)
    check_installed(base.logger)  # a missing extra stops the run before anything loads
    progress = make_board(base.progress)
    sweeps = merge_sweeps(base.sweep, req.sweeps)
    points = expand_sweeps(sweeps)
    cfgs = [
        (p, load_config(req.config, [*req.overrides, *(f"{k}={v}" for k, v in p.items())]))
        for p in points
    ]
    for _, c in cfgs:  # every grid point's names are validated before anything loads
        check_names(c)
    base = dataclasses.replace(base, methods=method_names(base), sweep=list(sweeps))
    plans = [(point, plan_experiment(cfg, progress=progress)) for point, cfg in cfgs]
    return base, progress, plans


def run(req: RunRequest, make_board: BoardFactory, announce: Announce = print) -> RunOutcome:
    """Plan every grid point, then run them into the run directory; returns
    every record (finished earlier ones included when resuming).
    ``make_board(enabled)`` gives the progress board (``enabled``: the
    config's ``progress``)."""
    base, progress, plans = plan_points(req, make_board)
    out = Path(req.out or base.out_dir or RunDir.default_path(base.name))
    config_text = to_yaml(base)
    done: list[RunRecord] = []
    if req.mode == "resume" and (out / "config.yaml").is_file():
        stored = _stored_config(out)
        given = _with_display_of(base, stored)
        if stored.strip() != given.strip():
            raise ConfigError(
                f"--resume {out}: this config differs from the run's config.yaml in "
                f"{config_differences(stored, given)}; resume with the same config and "
                "overrides (or start a new run)"
            )
        done = _finished(out)
        check_same_clients(out, done, plans)
    outcome = RunOutcome(base, out, records=list(done))
    skip = {record_key(r) for r in done}
    # what a reader needs to make the run again: the command and the code's commit
    info = {
        "command": req.command,
        "code": code_version(),
        "config": to_dict(base),
        "sweep": base.sweep,
    }
    t0 = time.perf_counter()
    trackers = TrackerGroup(base.logger)
    if req.mode == "resume" and trackers.trackers:  # a damaged file stops before the run does
        read_ids(out / IDS_FILE)
    with RunDir(out, mode=req.mode) as rd, progress, trackers:
        if req.mode != "resume":
            rd.write_text("config.yaml", f"# {req.command}\n" + config_text)
        rd.event("run_start", config=config_label(req.config), points=len(plans))
        if skip:
            rd.event("run_resumed", finished=len(skip))
        started = RunInfo(base.name, rd.path, req.command, info["config"], config_text)
        trackers.start(started, resumed=req.mode == "resume")

        def keep(record: RunRecord) -> None:
            info.pop("in_progress", None)
            outcome.records.append(record)
            report.write_metrics(rd.path / "metrics.json", outcome.records, info=info)
            trackers.log_record(record)

        def progress_of(context: Mapping[str, Any], rounds: list[dict[str, Any]]) -> None:
            # a multi-round method's rounds so far (not a record: --resume reruns it)
            info["in_progress"] = {**context, "rounds": rounds}
            report.write_metrics(rd.path / "metrics.json", outcome.records, info=info)
            last = rounds[-1]
            trackers.log_round(
                str(context["method"]),
                int(context["seed"]),
                str(context["point"]),
                int(last["round"]),
                round_scalars(last),
            )

        for i, (point, plan) in enumerate(plans, 1):
            if sweep_label(point):  # piped, a bare "partition.alpha=0.1" would say nothing
                announce(f"grid point {i} of {len(plans)}: {sweep_label(point)}")
            execute_plan(
                plan, rundir=rd, point=point, on_record=keep, on_round=progress_of, skip=skip
            )
        outcome.wall_s = time.perf_counter() - t0
        info["wall_time_s"] = round(outcome.wall_s, 3)
        report.write_metrics(rd.path / "metrics.json", outcome.records, info=info)
        trackers.finish(write_summary(rd, outcome))
        rd.event("run_end", wall_time_s=round(outcome.wall_s, 3), records=len(outcome.records))
    return outcome


def write_summary(rd: RunDir, outcome: RunOutcome) -> SummaryTable:
    """``summary.md`` (with the audit table when a run was audited) and
    ``curves.png``; returns the summary for the trackers."""
    base, records = outcome.base, outcome.records
    notes = [
        f"data `{base.data.source}`, {base.partition.num_clients} clients, "
        f"partition `{base.partition.scheme}`, model `{base.model.name}`, scale `{base.scale}`",
        f"seeds {sorted({r['seed'] for r in records})}; wall time {outcome.wall_s:.1f} s",
    ]
    rows = report.summarize(records)
    summary = report.summary_markdown(rows, title=f"osfl run: {base.name}", notes=notes)
    if any("audit" in r for r in records):  # privacy audits (audit=[rlu, ...]): their own table
        summary = summary.rstrip() + "\n\n" + audit_markdown(records)
    costs = report.convergence_markdown(records)
    if costs:
        summary = summary.rstrip() + "\n\n" + costs
    rd.write_text("summary.md", summary)
    report.plot_curves(records, rd.path / "curves.png", link_mbps=base.link_mbps)
    report.plot_frontier(records, rd.path / "frontier.png")
    columns, cells = report.table_rows(rows)
    return SummaryTable(summary, columns, cells)
