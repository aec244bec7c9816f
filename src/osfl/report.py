"""Results of a run: ``metrics.json``, the mean ± std table (terminal and
``summary.md``) and the accuracy-curve plot.

One *record* per (grid point, method, seed) — the schema is documented in
``docs/run-directory.md``. Tables group records by grid point and method and
report mean ± sample standard deviation over seeds, as the FL papers' tables
do; bytes and time are reported next to accuracy (docs/design.md §7: every result
carries its cost).
"""

from __future__ import annotations

import math
import os
import platform
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from osfl import __version__, jsonio
from osfl.convergence import link_seconds
from osfl.errors import DataError
from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id
from osfl.fl.regimes import REGIMES
from osfl.fl.upload import human_bytes

SCHEMA_VERSION = 1


def write_metrics(
    path: str | Path, records: Sequence[Mapping[str, Any]], *, info: Mapping[str, Any]
) -> Path:
    """``metrics.json``: ``{"schema_version", "osfl_version", "created", ..info, "records"}``,
    written atomically (runs rewrite it after every finished record)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "osfl_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **dict(info),
        "records": list(records),
    }
    p = Path(path)
    text = jsonio.dumps(doc, indent=2) + "\n"
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, p)  # atomic: a reader (or a crash) never sees half a file
    return p


def machine_info() -> dict[str, Any]:
    """What a CPU result depends on besides the code and the seed: the CPU
    kernel fingerprint (:mod:`osfl.fl.fingerprint`: torch's build and
    capability, oneDNN's ISA, the pinning variables, the CPU's flags and
    caches) and torch's thread count, plus the GPU, Python and platform."""
    kernels = cpu_fingerprint()
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_fingerprint": fingerprint_id(kernels),
        "cpu_kernels": kernels,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def _numbers(v: Any) -> bool:
    return isinstance(v, dict) and all(_number(x) for x in v.values())


def _byte_count(v: Any) -> bool:
    """A byte count: a finite number, never negative (a damaged file's ``-5``
    would be summed into a table's bytes)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 and (isinstance(v, int) or math.isfinite(v))


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


#: The record fields osfl's readers (tables, plots, audits) use, with what each
#: must be when present: a damaged file is one DataError, never a traceback.
RECORD_FIELDS: dict[str, tuple[Any, str]] = {
    "method": (lambda v: isinstance(v, str), "a string"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "point": (lambda v: isinstance(v, str), "a string"),
    "regime": (lambda v: isinstance(v, str), "a string"),
    "audit": (lambda v: isinstance(v, dict), "an object"),
    "method_config": (lambda v: v is None or isinstance(v, dict), "an object"),
    "train": (lambda v: v is None or isinstance(v, dict), "an object"),
    "partition": (lambda v: v is None or isinstance(v, dict), "an object"),
    "global_test_accuracy": (_number, "a number"),
    "server_accuracy": (_number, "a number"),
    "local_test_accuracy": (_number, "a number"),
    "bytes_up": (_byte_count, "a non-negative number"),
    "bytes_down": (_byte_count, "a non-negative number"),
    "time_s": (_numbers, "an object of numbers"),
    "warnings": (_strings, "a list of strings"),
    "curve": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list"),
}
REQUIRED_FIELDS = ("method", "seed")


def record_problem(r: Any) -> str | None:
    """Why ``r`` is not a record osfl's readers can use (``None``: it is)."""
    if not isinstance(r, dict):
        return "is not an object"
    for key in REQUIRED_FIELDS:
        if key not in r:
            return f"lacks {key!r}"
    for key, (ok, what) in RECORD_FIELDS.items():
        if key in r and not ok(r[key]):
            return f"field {key!r} must be {what}"
    return None


def read_metrics(path: str | Path) -> dict[str, Any]:
    """A run's ``metrics.json``, checked enough that its readers cannot trip on
    it: an object whose ``records`` is a list of records whose fields have the
    types :data:`RECORD_FIELDS` names (a string ``method`` and an integer
    ``seed`` at least). Anything else is one :class:`DataError` naming the
    file and the record; the text is read with bounded nesting
    (:func:`osfl.jsonio.loads`)."""
    try:
        doc = jsonio.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: damaged ({e})") from e
    records = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(records, list):
        raise DataError(f"{path}: damaged (no list of records)")
    for i, r in enumerate(records):
        why = record_problem(r)
        if why is not None:
            raise DataError(f"{path}: damaged (record {i} {why})")
    return doc


# --------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class Stat:
    """Mean, sample std (0 for one value) and count of one metric."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat | None:
        vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if not vals:
            return None
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        return cls(float(np.mean(vals)), std, len(vals))


@dataclass(frozen=True)
class Row:
    """One line of the table: a method at one grid point, aggregated over seeds."""

    point: str
    method: str
    seeds: tuple[int, ...]
    accuracy: Stat | None
    local_accuracy: Stat | None
    bytes_up: Stat | None
    bytes_down: Stat | None
    time_s: Stat | None
    warnings: tuple[str, ...] = ()
    regime: str = ""  # osfl.fl.method.REGIMES; "" for records written before regimes
    #: the server predictor's accuracy of a method whose accuracy is its clients' own models'
    server_accuracy: Stat | None = None
    at_sites: bool = False  # accuracy pooled from the sites' own test sets (real sites)


def _by_point_and_method(
    records: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """(grid point, method) -> its records (one per seed), in first-seen order."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r.get("point", ""), r["method"]), []).append(r)
    return groups


def summarize(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Group by (grid point, method) in first-seen order; mean ± std over seeds."""
    rows = []
    for (point, method), recs in _by_point_and_method(records).items():
        rows.append(
            Row(
                point=point,
                method=method,
                seeds=tuple(int(r["seed"]) for r in recs),
                accuracy=Stat.of([r.get("global_test_accuracy") for r in recs]),
                local_accuracy=Stat.of([r.get("local_test_accuracy") for r in recs]),
                bytes_up=Stat.of([r.get("bytes_up") for r in recs]),
                bytes_down=Stat.of([r.get("bytes_down") for r in recs]),
                time_s=Stat.of([r.get("time_s", {}).get("total") for r in recs]),
                warnings=tuple(
                    dict.fromkeys(
                        f"seed {r['seed']}: {w}" for r in recs for w in r.get("warnings", [])
                    )
                ),
                regime=str(recs[0].get("regime", "")),
                server_accuracy=Stat.of([r.get("server_accuracy") for r in recs]),
                at_sites=any(r.get("evaluated_at") == "sites" for r in recs),
            )
        )
    return rows


def per_seed(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows with the per-seed accuracies (%) behind each mean ± std:
    what REPRODUCTION keeps under ``reproduction/`` so a reader can re-derive a
    row, test another ordering or pool seeds, without the run directories."""
    out = []
    for (point, method), recs in _by_point_and_method(records).items():
        scored = [r for r in recs if r.get("global_test_accuracy") is not None]
        acc = {str(r["seed"]): round(100 * float(r["global_test_accuracy"]), 4) for r in scored}
        stat = Stat.of(list(acc.values()))
        if stat is None:
            continue
        row = {"point": point, "method": method, "regime": str(recs[0].get("regime", ""))}
        out.append({**row, "accuracy": acc, "mean": round(stat.mean, 4), "std": round(stat.std, 4)})
    return out


def by_regime(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows split by regime, in first-seen order: each is its own scoreboard
    (numbers of different regimes are never ranked in one table)."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.regime, []).append(r)
    return groups


def regime_heading(regime: str) -> str:
    """``regime: what it presupposes`` (the regime names of osfl.fl.method)."""
    return f"regime `{regime}`: {REGIMES[regime]}" if regime in REGIMES else f"regime `{regime}`"


def mean_std_text(values: Sequence[float]) -> str:
    """``"m ± s"`` of ``values`` (sample std, 2 decimals; one value alone): how
    REPRODUCTION prints a row of seeds."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _pct(s: Stat | None) -> str:
    if s is None:
        return "—"
    return f"{100 * s.mean:.2f}" if s.n == 1 else f"{100 * s.mean:.2f} ± {100 * s.std:.2f}"


def _bytes(s: Stat | None) -> str:
    return "—" if s is None else human_bytes(s.mean)


def _secs(s: Stat | None) -> str:
    return "—" if s is None else f"{s.mean:.1f}"


def table_rows(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells shared by the terminal and the Markdown tables."""
    with_point = any(r.point for r in rows)
    with_local = any(r.local_accuracy is not None for r in rows)
    with_server = any(r.server_accuracy is not None for r in rows)
    header = [*(["setting"] if with_point else []), "method", "seeds", "accuracy (%)"]
    header += ["server predictor (%)"] if with_server else []
    header += [*(["local acc. (%)"] if with_local else []), "bytes up", "bytes down", "time (s)"]
    with_notes = any(r.warnings for r in rows)
    header += ["notes"] if with_notes else []
    cells = []
    for r in rows:
        line = [*([r.point] if with_point else []), r.method, str(len(r.seeds)), _pct(r.accuracy)]
        line += [_pct(r.server_accuracy)] if with_server else []
        line += [*([_pct(r.local_accuracy)] if with_local else []), _bytes(r.bytes_up)]
        line += [_bytes(r.bytes_down), _secs(r.time_s)]
        if with_notes:
            n = len(r.warnings)
            line.append(f"{n} warning{'s' * (n != 1)}, see below" if n else "")
        cells.append(line)
    return header, cells


#: ``seed S: client C (round R): message``, as records and RunResult.warnings write them
_CLIENT_WARNING = re.compile(r"^(?:seed (\d+): )?client (\d+) \(round (\d+)\): (.*)$", re.S)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?")


def _span(values: Sequence[int]) -> str:
    """``3`` or ``3–28``."""
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def group_warnings(warnings: Sequence[str]) -> list[str]:
    """Per-client, per-round warnings of one kind folded into one line.

    A 30-round run can flag the same symptom (a rising loss, a client that did
    not learn) dozens of times; one line per kind says how often, for which
    clients, rounds and seeds, and quotes the first as an example. Kinds are
    the message with its numbers blanked; a kind seen once, and any warning
    not about one client's round, is kept as it was.
    """
    # Insertion-ordered groups: a kind of client warning, or one other warning alone.
    groups: dict[tuple[str, str], list[tuple[str, re.Match[str] | None]]] = {}
    for i, w in enumerate(warnings):
        m = _CLIENT_WARNING.match(w)
        key = ("kind", _NUMBER.sub("#", m.group(4))) if m else ("alone", str(i))
        groups.setdefault(key, []).append((w, m))
    lines = []
    for hits in groups.values():
        if len(hits) == 1:
            lines.append(hits[0][0])
            continue
        matches = [m for _, m in hits if m is not None]
        clients = sorted({int(m.group(2)) for m in matches})
        rounds = [int(m.group(3)) for m in matches]
        seeds = sorted({int(m.group(1)) for m in matches if m.group(1) is not None})
        where = f"clients {', '.join(map(str, clients))}; rounds {_span(rounds)}"
        where += f"; seeds {', '.join(map(str, seeds))}" if seeds else ""
        lines.append(f"{len(hits)} client trainings ({where}), e.g. {hits[0][0]}")
    return lines


def warning_lines(rows: Sequence[Row]) -> list[str]:
    """``method: warning`` lines of every row (what went wrong, with a hint),
    repeated per-client warnings folded by kind (:func:`group_warnings`). A
    warning that several methods of one setting share (the same cached
    client, trained once for all of them) is one line naming them all."""
    methods: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for w in group_warnings(r.warnings):
            methods.setdefault((r.point, w), []).append(r.method)
    return [
        f"{', '.join(names)}{f' ({point})' if point else ''}: {w}"
        for (point, w), names in methods.items()
    ]


def rich_table(rows: Sequence[Row], title: str = "") -> Any:
    """A ``rich.table.Table`` of the summary, for the terminal."""
    header, cells = table_rows(rows)
    table = Table(title=title or None)
    for i, h in enumerate(header):
        left = i < header.index("seeds")
        # Labels (method, setting) never wrap or shrink: numbers may.
        table.add_column(h, justify="left" if left else "right", no_wrap=left, min_width=len(h))
    for line in cells:
        table.add_row(*line)
    return table


def summary_markdown(rows: Sequence[Row], *, title: str, notes: Sequence[str] = ()) -> str:
    """``summary.md``: the table as GitHub Markdown (mean ± sample std over seeds)."""
    lines = [f"# {title}", ""]
    lines += [f"- {n}" for n in notes]
    if notes:
        lines.append("")
    groups = by_regime(rows)
    for regime, group in groups.items():
        if len(groups) > 1:
            lines += [f"## {regime_heading(regime)}", ""]
        header, cells = table_rows(group)
        right = header.index("seeds")
        lines.append("| " + " | ".join(header) + " |")
        lines.append(
            "|" + "|".join("---" if i < right else "---:" for i in range(len(header))) + "|"
        )
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        lines.append("")
    lines += [_accuracy_note(rows), ""]
    warned = warning_lines(rows)
    if warned:
        lines += ["## Warnings", "", *[f"- {w}" for w in warned], ""]
    return "\n".join(lines)


def _accuracy_note(rows: Sequence[Row]) -> str:
    """What the accuracy column is computed on: the global test set, or (real
    sites without a server test set) the sites' own test images, pooled."""
    sites = [r.method for r in rows if r.at_sites]
    if not sites and any(r.server_accuracy is not None for r in rows):
        return (
            "Accuracy: mean ± sample standard deviation over seeds (global test set; "
            "`local` and methods whose clients keep their own models, e.g. `eftvit`, report "
            "the mean accuracy of the clients' own models, the latter with the server "
            "predictor's beside it)."
        )
    if not sites:
        return (
            "Accuracy: mean ± sample standard deviation over seeds (global test set; "
            "`local` reports the mean accuracy of the clients' own models)."
        )
    which = "" if len(sites) == len(rows) else f" for {', '.join(dict.fromkeys(sites))}"
    return (
        "Accuracy: mean ± sample standard deviation over seeds; there is no global test "
        f"set{which}: each site scored the final model on its own test images and the "
        "accuracy is their correct predictions over their test images, summed over the sites "
        "(each site's own accuracy: `site_accuracies` in metrics.json)."
    )


def _by_method(records: Sequence[Mapping[str, Any]], key: str) -> dict[tuple[str, str], list]:
    """Records holding ``key`` (``curve`` with 2+ points, ``convergence``), grouped by
    (grid point, method) in first-seen order."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        value = r.get(key)
        if value and (key != "curve" or len(value) > 1):
            groups.setdefault((str(r.get("point", "")), str(r["method"])), []).append(r)
    return groups


def convergence_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The cost-to-accuracy table (:mod:`osfl.convergence`) of the records that
    have one, mean over seeds; empty when none has."""
    groups = _by_method(records, "convergence")
    if not groups:
        return ""
    first = next(iter(groups.values()))[0]["convergence"]
    target, link = first["target_accuracy"], first["link_mbps"]
    goal = f"{100 * target:.1f} %" if target is not None else "a target (set target_accuracy)"
    lines = [
        f"## Cost to accuracy (link {link:g} Mbit/s)",
        "",
        f"| setting | method | best acc. (%) | best round | rounds to {goal} "
        "| time to target (s) | total time (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (point, method), recs in groups.items():
        conv = [r["convergence"] for r in recs]
        reached = [c for c in conv if c["rounds_to_target"] is not None]
        rounds = Stat.of([c["rounds_to_target"] for c in reached])
        if target is None:
            to_target = when = "—"
        elif not reached:
            to_target, when = "not reached", "—"
        else:
            to_target = f"{rounds.mean:.1f}" if rounds else "—"
            to_target += f" ({len(reached)}/{len(conv)} seeds)" if len(conv) > 1 else ""
            when = _secs(Stat.of([c["time_to_target_s"] for c in reached]))
        best = Stat.of([c["best_accuracy"] for c in conv])
        best_round = Stat.of([c["best_round"] for c in conv])
        total = Stat.of([c["total_time_s"] for c in conv])
        cells = [point or "—", method, _pct(best), f"{best_round.mean:.0f}" if best_round else "—"]
        lines.append("| " + " | ".join([*cells, to_target, when, _secs(total)]) + " |")
    lines += [
        "",
        "Time: this machine's compute seconds (clients one after another) plus every byte "
        "up and down over one shared link.",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots
def plot_curves(
    records: Sequence[Mapping[str, Any]], path: str | Path, *, link_mbps: float | None = None
) -> Path | None:
    """Test accuracy per round for multi-round records that carry a ``curve``:
    one line per (grid point, method), the mean over seeds with a band of ±
    one sample std where there are several; ``None`` (no file) when no record
    has a curve. With ``link_mbps``, a second panel puts the same accuracies
    against the time under that link (:func:`osfl.convergence.link_seconds`,
    mean over seeds) counted from each curve's first evaluated round: the
    method that runs first pays the process's one-time costs (imports,
    allocations, first kernels), which would otherwise show as a method
    difference."""
    fig = curves_figure(records, link_mbps=link_mbps)
    if fig is None:
        return None
    out = Path(path)
    fig.savefig(out)
    return out


def curves_figure(records: Sequence[Mapping[str, Any]], *, link_mbps: float | None = None) -> Any:
    """The figure :func:`plot_curves` saves (``None`` without curves)."""
    groups = _by_method(records, "curve")
    if not groups:
        return None
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    timed = link_mbps is not None and _all_timed(groups)
    fig = Figure(figsize=(11 if timed else 7, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2 if timed else 1, 1)
    ax_time = fig.add_subplot(1, 2, 2, sharey=ax) if timed else None
    colours = _colours(len(groups))
    for (point, method), recs in groups.items():
        label = f"{method} ({point})" if point else method
        label += f", {len(recs)} seeds" if len(recs) > 1 else ""
        _plot_curve(ax, ax_time, recs, label, next(colours), link_mbps)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _label_curve_axes(ax, ax_time, link_mbps)
    return fig


def _all_timed(groups: Mapping[tuple[str, str], list[Mapping[str, Any]]]) -> bool:
    """Whether every curve point carries the seconds and bytes the time panel needs."""
    return all(
        "seconds" in p and "bytes" in p
        for recs in groups.values()
        for r in recs
        for p in r["curve"]
    )


def _curve_arrays(
    recs: Sequence[Mapping[str, Any]], link_mbps: float | None
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The rounds (counted from 1), accuracy in % per (seed, round) and, with
    ``link_mbps``, total seconds under that link; NaN where a seed lacks a
    round, so means and stds skip it."""
    rounds = sorted({p["round"] for r in recs for p in r["curve"]})
    table = np.full((len(recs), len(rounds)), np.nan)
    times = np.full((len(recs), len(rounds)), np.nan)
    for i, r in enumerate(recs):
        for p in r["curve"]:
            table[i, rounds.index(p["round"])] = 100 * p["accuracy"]
            if link_mbps is not None:
                times[i, rounds.index(p["round"])] = link_seconds(p, link_mbps)
    return [x + 1 for x in rounds], table, times


def _plot_curve(
    ax: Any,
    ax_time: Any,
    recs: Sequence[Mapping[str, Any]],
    label: str,
    colour: Any,
    link_mbps: float | None,
) -> None:
    """One (grid point, method): its mean accuracy per round, a ± std band over
    several seeds, and the same means against time on ``ax_time`` if given."""
    xs, table, times = _curve_arrays(recs, link_mbps if ax_time is not None else None)
    mean = np.nanmean(table, axis=0)
    ax.plot(xs, mean, marker="o", markersize=3, color=colour, label=label)
    if len(recs) > 1:
        std = np.nanstd(table, axis=0, ddof=1)
        # an accuracy lies in [0, 100] %: a band past either end shows no seed's value
        low, high = np.clip(mean - std, 0.0, 100.0), np.clip(mean + std, 0.0, 100.0)
        ax.fill_between(xs, low, high, color=colour, alpha=0.18, linewidth=0)
    if ax_time is not None:
        # from the first evaluated round on: one-time costs land on whichever method ran first
        elapsed = times - times[:, :1]
        ax_time.plot(np.nanmean(elapsed, axis=0), mean, marker="o", markersize=3, color=colour)


def _label_curve_axes(ax: Any, ax_time: Any, link_mbps: float | None) -> None:
    """Axis labels, titles and grids; one legend, right of the last panel."""
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Test accuracy per round (mean ± std over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax_time is not None:
        ax_time.set_xlabel(
            f"compute + transfer time at {link_mbps:g} Mbit/s (s), after the first evaluated "
            "round\n(its one-time warm-up falls on the method that runs first: left out)"
        )
        ax_time.set_title("Accuracy against time", fontsize=10)
        ax_time.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # the lines are labelled once, per round
    (ax_time or ax).legend(
        handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0
    )


def plot_frontier(records: Sequence[Mapping[str, Any]], path: str | Path) -> Path | None:
    """Accuracy against total bytes (up + down), one labelled point per (grid
    point, method), mean over seeds, one marker per regime: the bytes–accuracy
    frontier of a comparison (FENS against one-shot FedAvg, Ensemble and
    multi-round FedAvg). ``None`` (no file) with fewer than two methods."""
    fig = frontier_figure(records)
    if fig is None:
        return None
    out = Path(path)
    fig.savefig(out)
    return out


#: Bytes spanning less than this ratio are drawn on a linear axis (a log axis
#: would give them one tick label between them).
LOG_AXIS_SPAN = 10.0


def frontier_figure(records: Sequence[Mapping[str, Any]]) -> Any:
    """The figure :func:`plot_frontier` saves: every point labelled with its
    method and bytes; a linear bytes axis with ticks that resolve the range when
    the bytes span less than :data:`LOG_AXIS_SPAN`, a log axis with 1-2-5 ticks
    beyond."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("global_test_accuracy") is not None and "bytes_up" in r:
            groups.setdefault((str(r.get("point", "")), str(r["method"])), []).append(r)
    if len({m for _, m in groups}) < 2:
        return None
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = dict(zip(REGIMES, "osD^", strict=True))
    colours = _colours(len(groups))
    points, floors = [], []
    for (point, method), recs in groups.items():
        sent = float(np.mean([r["bytes_up"] + r.get("bytes_down", 0) for r in recs]))
        accs = [100 * float(r["global_test_accuracy"]) for r in recs]
        label = f"{method} ({point})" if point else method
        marker = markers.get(str(recs[0].get("regime")), "x")
        item = (sent, float(np.mean(accs)), _spread(accs), label, marker, next(colours))
        (floors if method in NO_FEDERATION else points).append(item)
    if not points:
        points, floors = floors, []
    _frontier_points(ax, points)
    for sent, acc, spread, label, _, colour in floors:
        _floor_line(ax, sent, acc, spread, label, colour)
    _bytes_axis(ax, min(p[0] for p in points), max(p[0] for p in points))
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy against communication (mean ± std over seeds)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


#: Methods whose clients federate nothing (``local``: each keeps its own
#: model). Their records count the upload a server would receive, so that the
#: bytes column stays comparable; the frontier draws them as a level line (the
#: accuracy without federating), not as a point that communicated.
NO_FEDERATION = ("local",)


def _spread(accs: Sequence[float]) -> tuple[float, float]:
    """How far below and above the mean a ± one sample std error bar reaches
    (0 for one seed), clipped to [0, 100] %: no seed can pass either end."""
    if len(accs) < 2:
        return 0.0, 0.0
    mean, std = float(np.mean(accs)), float(np.std(accs, ddof=1))
    return mean - max(mean - std, 0.0), min(mean + std, 100.0) - mean


def _frontier_points(ax: Any, points: Sequence[tuple[Any, ...]]) -> None:
    """One marker per method with its ± std error bar and its label. Points at
    (nearly) the same bytes, e.g. one-shot FedAvg and Ensemble, which send the
    same weights, take their labels on alternate sides so that they never
    print over each other."""
    hi = max(p[0] for p in points)
    side, last = 0, None
    for sent, acc, (below, above), label, marker, colour in sorted(points, key=lambda p: p[:2]):
        side = side + 1 if last is not None and abs(sent - last) <= 0.01 * hi else 0
        last = sent
        ax.scatter([sent], [acc], marker=marker, color=colour, label=label, s=36, zorder=3)
        if below or above:
            ax.errorbar([sent], [acc], yerr=[[below], [above]], fmt="none", ecolor=colour,
                        elinewidth=1, capsize=3)  # fmt: skip
        left = side % 2 == 1
        ax.annotate(
            f"{label}\n{human_bytes(sent)}",
            (sent, acc),
            xytext=(-5 if left else 5, 4 - 10 * (side // 2)),  # a third one: lower
            textcoords="offset points",
            ha="right" if left else "left",
            fontsize=7,
            color=colour,
        )


def _floor_line(
    ax: Any, sent: float, acc: float, spread: tuple[float, float], label: str, colour: Any
) -> None:
    """A method that federates nothing (:data:`NO_FEDERATION`): a dashed level
    line at its accuracy (a band of ± std over seeds), labelled at the right
    edge, in the room the bytes axis leaves there for labels."""
    ax.axhline(acc, color=colour, linestyle="--", linewidth=1, label=f"{label} (no federation)")
    below, above = spread
    if below or above:
        ax.axhspan(acc - below, acc + above, color=colour, alpha=0.12, linewidth=0)
    ax.annotate(
        f"{label}\nno federation; upload would be {human_bytes(sent)}",
        (1.0, acc),
        xycoords=("axes fraction", "data"),
        xytext=(-4, 3),
        textcoords="offset points",
        ha="right",
        fontsize=7,
        color=colour,
    )


def _bytes_axis(ax: Any, lo: float, hi: float) -> None:
    """A bytes x axis whose tick labels tell the points apart (see :func:`frontier_figure`)."""
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib.ticker import FuncFormatter, LogLocator, MultipleLocator, NullFormatter

    ax.margins(y=0.12)  # room above the top point for its label
    if hi / max(lo, 1.0) < LOG_AXIS_SPAN:
        pad = max(0.08 * (hi - lo), 0.02 * hi)
        ax.set_xlim(lo - pad, hi + 2.5 * pad)  # room on the right for the labels
        exp = min(int(math.log(hi, 1024)), 4) if hi >= 1024 else 0
        unit, name = 1024**exp, ["B", "KiB", "MiB", "GiB", "TiB"][exp]
        step = _nice_step((hi - lo + 3.5 * pad) / unit / 5)
        decimals = max(0, -math.floor(math.log10(step)))
        ax.xaxis.set_major_locator(MultipleLocator(step * unit))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / unit:.{decimals}f} {name}"))
        ax.set_xlabel("bytes up + down, all clients")
        return
    ax.set_xscale("log")
    ax.set_xlim(lo / 1.5, hi * 2.5)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("bytes up + down, all clients (log scale)")


def _nice_step(raw: float) -> float:
    """The 1-2-2.5-5 × 10^k step at or above ``raw``."""
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _colours(n: int) -> Any:
    """Distinct colours for ``n`` lines (tab10, then tab20, then a colormap sweep)."""
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib import colormaps

    if n <= 10:
        base = colormaps["tab10"].colors
    elif n <= 20:
        base = colormaps["tab20"].colors
    else:
        base = [colormaps["turbo"](i / max(1, n - 1)) for i in range(n)]
    return iter(base)
