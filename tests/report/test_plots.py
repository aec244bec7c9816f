"""The figures ``osfl.report`` draws: the frontier (accuracy against bytes,
± std bars, ``local`` as a level) and the curves' band within 0–100 %."""

from __future__ import annotations

import pytest

from osfl import report


def test_frontier_plot_needs_two_methods(tmp_path):
    one = [{"method": "fedavg", "seed": 0, "global_test_accuracy": 0.5, "bytes_up": 10}]
    assert report.plot_frontier(one, tmp_path / "none.png") is None
    two = [
        *one,
        {"method": "fens", "seed": 0, "global_test_accuracy": 0.7, "bytes_up": 40,
         "bytes_down": 90, "regime": "scratch"},
    ]  # fmt: skip
    path = report.plot_frontier(two, tmp_path / "frontier.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_the_curves_band_stays_within_0_and_100_percent() -> None:
    from osfl import report

    recs = [
        {
            "method": "fedavg",
            "seed": s,
            "curve": [{"round": r, "global_test_accuracy": a} for r in range(3)],
        }
        for s, a in enumerate((0.99, 1.0, 0.97))
    ]
    fig = report.curves_figure(recs)
    (band,) = fig.axes[0].collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    assert max(ys) <= 100.0 and max(ys) > 99.0


def test_the_frontier_has_error_bars_separate_labels_and_local_as_a_level() -> None:
    """Two seeds: ± std bars; FedAvg and Ensemble send the same bytes, so
    their labels take opposite sides; ``local`` federates nothing, so it is a
    dashed level line, not a point that communicated."""
    from osfl import report

    kib = 1024
    accs = {"local": (0.60, 0.64), "fedavg": (0.62, 0.61), "ensemble": (0.70, 0.74)}
    recs = [
        {"method": m, "seed": s, "global_test_accuracy": a[s], "bytes_up": 500 * kib,
         "bytes_down": 465 * kib, "regime": "scratch"}
        for m, a in accs.items()
        for s in (0, 1)
    ]  # fmt: skip
    fig = report.frontier_figure(recs)
    (ax,) = fig.axes
    scattered = {c.get_label() for c in ax.collections if c.get_label() in accs}
    assert scattered == {"fedavg", "ensemble"}
    level = [ln for ln in ax.get_lines() if ln.get_label() == "local (no federation)"]
    assert len(level) == 1 and level[0].get_ydata()[0] == pytest.approx(62.0)
    assert len(ax.containers) == 2  # the two error bars
    sides = {t.get_text().split("\n")[0]: t.get_ha() for t in ax.texts}
    assert {sides["fedavg"], sides["ensemble"]} == {"left", "right"}
    assert any(t.get_text().startswith("local\nno federation") for t in ax.texts)
