"""What a researcher trying osfl for the first time reads: plots whose numbers
can be read, a sites summary that says where its accuracy comes from, and one
clear line naming the fix for each small mistake."""

from __future__ import annotations

import pytest

from osfl import report

KIB = 1024


def _frontier(bytes_by_method: dict[str, float]):
    records = [
        {"method": m, "seed": 0, "global_test_accuracy": 0.5 + 0.05 * i, "bytes_up": b / 2,
         "bytes_down": b / 2, "regime": "scratch"}
        for i, (m, b) in enumerate(bytes_by_method.items())
    ]  # fmt: skip
    fig = report.frontier_figure(records)
    fig.canvas.draw()
    (ax,) = fig.axes
    lo, hi = ax.get_xlim()
    ticks = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    return ax, [t for t in ticks if t]


def test_a_frontier_within_two_percent_shows_every_methods_bytes() -> None:
    # the default run: local, fedavg and ensemble send 965 KiB, fafi 980.6 KiB
    sent = {"local": 965 * KIB, "fedavg": 965 * KIB, "ensemble": 965 * KIB, "fafi": 980.6 * KIB}
    ax, ticks = _frontier(sent)
    assert ax.get_xscale() == "linear"
    assert len(set(ticks)) >= 3  # ticks that resolve the range, not one label
    labels = [t.get_text() for t in ax.texts]
    for m, b in sent.items():
        assert any(t.startswith(m + "\n") and t.endswith(report.human_bytes(b)) for t in labels)


def test_a_frontier_over_decades_is_logarithmic_with_several_labels() -> None:
    ax, ticks = _frontier({"fedavg": 400 * KIB, "fens": 40 * KIB * KIB, "fedpft": 9 * KIB})
    assert ax.get_xscale() == "log" and len(set(ticks)) >= 3


def test_the_time_panel_starts_after_the_first_round() -> None:
    """The first method run pays one-time costs (imports, allocations): the
    time panel starts each curve at its first evaluated round."""
    curve = lambda t0: [  # noqa: E731
        {"round": r, "global_test_accuracy": 0.5, "bytes": 0, "seconds": t0 + 2.0 * r}
        for r in range(3)
    ]
    recs = [
        {"method": "fedavg", "seed": 0, "curve": curve(30.0)},  # ran first: 30 s of warm-up
        {"method": "fedprox", "seed": 0, "curve": curve(2.0)},
    ]
    fig = report.curves_figure(recs, link_mbps=1e9)
    time_ax = fig.axes[1]
    starts = [line.get_xdata()[0] for line in time_ax.get_lines()]
    ends = [line.get_xdata()[-1] for line in time_ax.get_lines()]
    assert starts == [0.0, 0.0] and ends[0] == pytest.approx(ends[1])
    assert "after the first evaluated round" in time_ax.get_xlabel()


def test_a_sites_summary_says_where_its_accuracy_comes_from() -> None:
    rec = {"method": "fedavg", "seed": 0, "global_test_accuracy": 0.8, "evaluated_at": "sites",
           "site_accuracies": {"0": 0.7, "1": 0.9}}  # fmt: skip
    text = report.summary_markdown(report.summarize([rec]), title="t")
    assert "global test set" not in text.replace("no global test set", "")
    assert "each site scored the final model on its own test images" in text
    server = report.summary_markdown(
        report.summarize([{**rec, "evaluated_at": "server"}]), title="t"
    )
    assert "(global test set;" in server
