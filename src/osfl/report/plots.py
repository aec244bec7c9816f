"""The plots of a run: test accuracy per round (and against time under a
link), and the bytes–accuracy frontier of a comparison. matplotlib is
imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from osfl.convergence import link_seconds
from osfl.fl.regimes import REGIMES
from osfl.fl.upload import human_bytes
from osfl.interrupts import atomic_section
from osfl.record import RunRecord, typed
from osfl.report.tables import records_with


def plot_curves(
    records: Sequence[RunRecord | Mapping[str, Any]],
    path: str | Path,
    *,
    link_mbps: float | None = None,
) -> Path | None:
    """Test accuracy per round for multi-round records that carry a ``curve``
    (each point's accuracy the table ranks: the server predictor's, else the
    clients' own models' mean, :attr:`osfl.record.CurvePoint.ranked_accuracy`):
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
    with atomic_section():  # Ctrl-C never leaves half a PNG
        fig.savefig(out)
    return out


def curves_figure(
    records: Sequence[RunRecord | Mapping[str, Any]], *, link_mbps: float | None = None
) -> Any:
    """The figure :func:`plot_curves` saves (``None`` without curves)."""
    groups = records_with(records, "curve")
    if not groups:
        return None
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy: matplotlib
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib

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


def _all_timed(groups: Mapping[tuple[str, str], list[RunRecord]]) -> bool:
    """Whether every curve point carries the seconds and bytes the time panel needs."""
    return all(
        p.seconds is not None and p.bytes is not None
        for recs in groups.values()
        for r in recs
        for p in r.curve
    )


def _curve_arrays(
    recs: Sequence[RunRecord], link_mbps: float | None
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The rounds (counted from 1), accuracy in % per (seed, round) and, with
    ``link_mbps``, total seconds under that link; NaN where a seed lacks a
    round, so means and stds skip it."""
    rounds = sorted({p.round for r in recs for p in r.curve})
    table = np.full((len(recs), len(rounds)), np.nan)
    times = np.full((len(recs), len(rounds)), np.nan)
    for i, r in enumerate(recs):
        for p in r.curve:
            at = rounds.index(p.round)
            if p.ranked_accuracy is not None:
                table[i, at] = 100 * p.ranked_accuracy
            if link_mbps is not None:
                times[i, at] = link_seconds({"seconds": p.seconds, "bytes": p.bytes}, link_mbps)
    return [x + 1 for x in rounds], table, times


def _plot_curve(
    ax: Any,
    ax_time: Any,
    recs: Sequence[RunRecord],
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


def plot_frontier(
    records: Sequence[RunRecord | Mapping[str, Any]], path: str | Path
) -> Path | None:
    """Accuracy against total bytes (up + down), one labelled point per (grid
    point, method), mean over seeds, one marker per regime: the bytes–accuracy
    frontier of a comparison (FENS against one-shot FedAvg, Ensemble and
    multi-round FedAvg). ``None`` (no file) with fewer than two methods."""
    fig = frontier_figure(records)
    if fig is None:
        return None
    out = Path(path)
    with atomic_section():  # Ctrl-C never leaves half a PNG
        fig.savefig(out)
    return out


#: Bytes spanning less than this ratio are drawn on a linear axis (a log axis
#: would give them one tick label between them).
LOG_AXIS_SPAN = 10.0


def frontier_figure(records: Sequence[RunRecord | Mapping[str, Any]]) -> Any:
    """The figure :func:`plot_frontier` saves: every point labelled with its
    method and bytes; a linear bytes axis with ticks that resolve the range when
    the bytes span less than :data:`LOG_AXIS_SPAN`, a log axis with 1-2-5 ticks
    beyond."""
    groups = _frontier_groups(typed(records))
    if len({m for _, m in groups}) < 2:
        return None
    # heavy: matplotlib (only runs that plot pay for it)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy: matplotlib

    fig = Figure(figsize=(7.5, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = dict(zip(REGIMES, "osD^", strict=True))
    colours = _colours(len(groups))
    points, floors = [], []
    for (point, method), recs in groups.items():
        sent = float(np.mean([r.bytes_up + (r.bytes_down or 0) for r in recs]))  # type: ignore[operator]
        accs = [100 * float(r.ranked_accuracy) for r in recs]  # type: ignore[arg-type]
        label = f"{method} ({point})" if point else method
        marker = markers.get(recs[0].regime, "x")
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


def _frontier_groups(records: Sequence[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    """The records with an accuracy and a byte count, by (grid point, method)."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        if r.ranked_accuracy is not None and r.bytes_up is not None:
            groups.setdefault((r.point, r.method), []).append(r)
    return groups


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
            ax.errorbar(
                [sent],
                [acc],
                yerr=[[below], [above]],
                fmt="none",
                ecolor=colour,
                elinewidth=1,
                capsize=3,
            )
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
