"""The summary of a run's records: mean ± std over seeds per (grid point,
method), as the FL papers' tables report them, for the terminal (rich),
``summary.md`` and ``osfl table``; bytes and time beside accuracy
(docs/design.md §7: every result carries its cost).

Records are read as types (:class:`osfl.record.RunRecord` attributes; plain
objects are read into one first). The accuracy a row ranks by has one meaning
(:attr:`osfl.record.RunRecord.ranked_accuracy`):
the server predictor's test accuracy; a method without one (``local``) shows
the mean of its clients' own models instead, in a marked cell (†) with a note
saying so; a method with both (EFTViT) shows the clients' mean in a column of
its own.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.table import Table

from osfl.fl.regimes import REGIMES
from osfl.fl.upload import human_bytes
from osfl.record import RunRecord, typed

#: The mark of an accuracy cell that is the clients' own models' mean.
CLIENTS_MEAN_MARK = "†"


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
    #: the clients' own models' mean where the accuracy is the server predictor's (EFTViT)
    client_models: Stat | None = None
    at_sites: bool = False  # accuracy pooled from the sites' own test sets (real sites)
    #: ``accuracy`` is the clients' own models' mean: there is no server predictor (``local``)
    clients_mean: bool = False


def _by_point_and_method(
    records: Sequence[RunRecord | Mapping[str, Any]],
) -> dict[tuple[str, str], list[RunRecord]]:
    """(grid point, method) -> its records (one per seed), in first-seen order."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in typed(records):
        groups.setdefault((r.point, r.method), []).append(r)
    return groups


def _row(point: str, method: str, recs: Sequence[RunRecord]) -> Row:
    """One (grid point, method)'s records as a row of the table."""
    warnings = (f"seed {r.seed}: {w}" for r in recs for w in r.warnings)
    return Row(
        point=point,
        method=method,
        seeds=tuple(r.seed for r in recs),
        accuracy=Stat.of([r.ranked_accuracy for r in recs]),
        local_accuracy=Stat.of([r.local_test_accuracy for r in recs]),
        bytes_up=Stat.of([r.bytes_up for r in recs]),
        bytes_down=Stat.of([r.bytes_down for r in recs]),
        time_s=Stat.of([r.total_seconds for r in recs]),
        warnings=tuple(dict.fromkeys(warnings)),
        regime=recs[0].regime,
        client_models=Stat.of(
            [r.mean_client_accuracy for r in recs if r.global_test_accuracy is not None]
        ),
        at_sites=any(r.evaluated_at == "sites" for r in recs),
        clients_mean=any(r.accuracy_is_clients_mean for r in recs),
    )


def summarize(records: Sequence[RunRecord | Mapping[str, Any]]) -> list[Row]:
    """Group by (grid point, method) in first-seen order; mean ± std over seeds."""
    return [
        _row(point, method, recs) for (point, method), recs in _by_point_and_method(records).items()
    ]


def per_seed(records: Sequence[RunRecord | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows with the per-seed accuracies (%) behind each mean ± std:
    what REPRODUCTION keeps under ``reproduction/`` so a reader can re-derive a
    row, test another ordering or pool seeds, without the run directories."""
    out = []
    for (point, method), recs in _by_point_and_method(records).items():
        acc = {
            str(r.seed): round(100 * float(r.ranked_accuracy), 4)
            for r in recs
            if r.ranked_accuracy is not None
        }
        stat = Stat.of(list(acc.values()))
        if stat is None:
            continue
        row = {"point": point, "method": method, "regime": recs[0].regime}
        if any(r.accuracy_is_clients_mean for r in recs):  # no server predictor (`local`)
            row["accuracy_of"] = "mean of the clients' own models"
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


@dataclass(frozen=True)
class _Columns:
    """Which optional columns a table has: the grid point, the clients' own
    models, the local accuracy, the notes."""

    point: bool
    clients: bool
    local: bool
    notes: bool

    @classmethod
    def of(cls, rows: Sequence[Row]) -> _Columns:
        return cls(
            point=any(r.point for r in rows),
            clients=any(r.client_models is not None for r in rows),
            local=any(r.local_accuracy is not None for r in rows),
            notes=any(r.warnings for r in rows),
        )

    def header(self) -> list[str]:
        return [
            *(["setting"] if self.point else []),
            "method",
            "seeds",
            "accuracy (%)",
            *(["clients' own models (%)"] if self.clients else []),
            *(["local acc. (%)"] if self.local else []),
            "bytes up",
            "bytes down",
            "time (s)",
            *(["notes"] if self.notes else []),
        ]

    def cells(self, r: Row) -> list[str]:
        accuracy = _pct(r.accuracy) + (CLIENTS_MEAN_MARK if r.clients_mean else "")
        n = len(r.warnings)
        note = f"{n} warning{'s' * (n != 1)}, see below" if n else ""
        return [
            *([r.point] if self.point else []),
            r.method,
            str(len(r.seeds)),
            accuracy,
            *([_pct(r.client_models)] if self.clients else []),
            *([_pct(r.local_accuracy)] if self.local else []),
            _bytes(r.bytes_up),
            _bytes(r.bytes_down),
            _secs(r.time_s),
            *([note] if self.notes else []),
        ]


def table_rows(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells shared by the terminal and the Markdown tables."""
    columns = _Columns.of(rows)
    return columns.header(), [columns.cells(r) for r in rows]


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
    marked = clients_mean_note(rows)
    table = Table(title=title or None, caption=marked or None, caption_justify="left")
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
    marked = clients_mean_note(rows)
    lines += [marked, ""] if marked else []
    warned = warning_lines(rows)
    if warned:
        lines += ["## Warnings", "", *[f"- {w}" for w in warned], ""]
    return "\n".join(lines)


def _accuracy_note(rows: Sequence[Row]) -> str:
    """What the accuracy column is computed on: the global test set, or (real
    sites without a server test set) the sites' own test images, pooled."""
    sites = [r.method for r in rows if r.at_sites]
    if not sites and any(r.client_models is not None for r in rows):
        return (
            "Accuracy: mean ± sample standard deviation over seeds (global test set; the "
            "server's predictor; methods whose clients keep their own models, e.g. `eftvit`, "
            "have the mean accuracy of the clients' own models beside it)."
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


def clients_mean_note(rows: Sequence[Row]) -> str:
    """The note of the marked accuracy cells ("" when none is marked)."""
    methods = list(dict.fromkeys(r.method for r in rows if r.clients_mean))
    if not methods:
        return ""
    return (
        f"{CLIENTS_MEAN_MARK} mean of the clients' own models "
        f"({', '.join(methods)}: no server predictor)"
    )


def records_with(
    records: Sequence[RunRecord | Mapping[str, Any]], key: str
) -> dict[tuple[str, str], list[RunRecord]]:
    """Records holding ``key`` (``curve`` with 2+ points, ``convergence``), grouped by
    (grid point, method) in first-seen order."""
    has = {
        "curve": lambda r: len(r.curve) > 1,
        "convergence": lambda r: bool(r.convergence),
    }[key]
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in typed(records):
        if has(r):
            groups.setdefault((r.point, r.method), []).append(r)
    return groups


def _to_target(conv: Sequence[Mapping[str, Any]], target: float | None) -> tuple[str, str]:
    """The cells "rounds to target" and "time to target" of one row's seeds."""
    if target is None:
        return "—", "—"
    reached = [c for c in conv if c["rounds_to_target"] is not None]
    if not reached:
        return "not reached", "—"
    rounds = Stat.of([c["rounds_to_target"] for c in reached])
    text = f"{rounds.mean:.1f}" if rounds else "—"
    text += f" ({len(reached)}/{len(conv)} seeds)" if len(conv) > 1 else ""
    return text, _secs(Stat.of([c["time_to_target_s"] for c in reached]))


def _convergence_line(point: str, method: str, recs: Sequence[RunRecord], target: Any) -> str:
    """One (grid point, method)'s row of the cost-to-accuracy table."""
    conv = [r.convergence or {} for r in recs]
    to_target, when = _to_target(conv, target)
    best = Stat.of([c["best_accuracy"] for c in conv])
    best_round = Stat.of([c["best_round"] for c in conv])
    total = Stat.of([c["total_time_s"] for c in conv])
    which = {c.get("accuracy_key", "global_test_accuracy") for c in conv}
    mark = CLIENTS_MEAN_MARK if "mean_client_accuracy" in which else ""
    cells = [point or "—", method, _pct(best) + mark]
    cells.append(f"{best_round.mean:.0f}" if best_round else "—")
    return "| " + " | ".join([*cells, to_target, when, _secs(total)]) + " |"


def convergence_markdown(records: Sequence[RunRecord | Mapping[str, Any]]) -> str:
    """The cost-to-accuracy table (:mod:`osfl.convergence`) of the records that
    have one, mean over seeds; empty when none has. It measures the accuracy
    a table ranks (the record's ``convergence.accuracy_key``: the server
    predictor's; a method without one, marked †, its clients' own models')."""
    groups = records_with(records, "convergence")
    if not groups:
        return ""
    first = next(iter(groups.values()))[0].convergence or {}
    target, link = first["target_accuracy"], first["link_mbps"]
    goal = f"{100 * target:.1f} %" if target is not None else "a target (set target_accuracy)"
    lines = [
        f"## Cost to accuracy (link {link:g} Mbit/s)",
        "",
        f"| setting | method | best acc. (%) | best round | rounds to {goal} "
        "| time to target (s) | total time (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [_convergence_line(p, m, recs, target) for (p, m), recs in groups.items()]
    lines += [
        "",
        "Accuracy: the server predictor's test accuracy (`global_test_accuracy`; "
        f"{CLIENTS_MEAN_MARK}: no server predictor, the mean of the clients' own models). "
        "Time: this machine's compute seconds (clients one after another) plus every byte "
        "up and down over one shared link.",
        "",
    ]
    return "\n".join(lines)
