"""The tables ``osfl.report`` writes from records: one scoreboard per regime,
never one ranking across regimes, and the cost-to-accuracy table with its
time panel (from ``osfl.convergence``'s blocks)."""

from __future__ import annotations

from osfl import report
from osfl.convergence import convergence

CURVE = [
    {"round": 0, "global_test_accuracy": 0.40, "bytes": 1_000_000, "seconds": 2.0},
    {"round": 1, "global_test_accuracy": 0.62, "bytes": 2_000_000, "seconds": 4.0},
    {"round": 2, "global_test_accuracy": 0.58, "bytes": 3_000_000, "seconds": 6.0},
]


def test_summary_table_and_time_panel(tmp_path):
    recs = []
    for seed, target in ((0, 0.6), (1, 0.6)):
        curve = [dict(p) for p in CURVE]
        if seed == 1:
            curve[1]["global_test_accuracy"] = 0.5  # this seed only reaches 0.58: never the target
        recs.append(
            {
                "method": "eftvit",
                "seed": seed,
                "curve": curve,
                "convergence": convergence(curve, target_accuracy=target, link_mbps=8.0),
            }
        )
    md = report.convergence_markdown(recs)
    assert "## Cost to accuracy (link 8 Mbit/s)" in md
    assert "rounds to 60.0 %" in md
    row = next(line for line in md.splitlines() if "| eftvit |" in line)
    assert "2.0 (1/2 seeds)" in row and "| 6.0 |" in row and row.endswith("| 9.0 |")
    assert report.convergence_markdown([{"method": "fedavg", "seed": 0}]) == ""
    path = report.plot_curves(recs, tmp_path / "curves.png", link_mbps=8.0)
    assert path is not None and path.stat().st_size > 0


def test_regimes_get_one_table_each():
    """A run that mixes regimes prints one scoreboard per regime, never one ranking."""
    from osfl.fl.regimes import run_regime

    assert run_regime("scratch", pretrained_weights=True) == "pretrained"
    assert run_regime("pretrained", pretrained_weights=False) == "scratch"
    assert run_regime("frozen_encoder", pretrained_weights=True) == "frozen_encoder"
    recs = [
        {"method": "fedavg", "seed": 0, "global_test_accuracy": 0.6, "regime": "pretrained"},
        {"method": "falcon", "seed": 0, "global_test_accuracy": 0.63, "regime": "frozen_encoder"},
        {"method": "fedcgs", "seed": 0, "global_test_accuracy": 0.69, "regime": "frozen_encoder"},
    ]
    rows = report.summarize(recs)
    assert {k: [r.method for r in v] for k, v in report.by_regime(rows).items()} == {
        "pretrained": ["fedavg"],
        "frozen_encoder": ["falcon", "fedcgs"],
    }
    md = report.summary_markdown(rows, title="t")
    assert md.count("| method | seeds |") == 2
    assert "## regime `frozen_encoder`: a frozen pretrained encoder" in md
    assert md.index("| fedavg |") < md.index("## regime `frozen_encoder`") < md.index("| falcon |")
    one = report.summary_markdown(report.summarize(recs[1:]), title="t")
    assert "## regime" not in one and one.count("| method | seeds |") == 1
