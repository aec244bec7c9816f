"""The ``osfl`` commands end to end: run directories, sweeps, partition, list,
tables and curves, checkpoints, refusals before training (the entry point's
exit statuses and argument order: ``tests/test_cli.py``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.config import load_config
from osfl.data.federation import Federation
from support.cli import error_line
from support.smoke import tiny_cli_args

PNG = b"\x89PNG\r\n\x1a\n"


def tiny(tmp_path: Path) -> list[str]:
    return tiny_cli_args(tmp_path, progress=True)


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    assert any(r.startswith("fedavg scratch one-shot weights ") for r in rows)
    assert any(r.startswith("falcon frozen_encoder one-shot synthetic_data ") for r in rows)
    for name in ("digits", "dirichlet", "cnn_small", "fedprox"):
        assert name in out


def test_run_writes_a_complete_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "seeds=[0,1]", "--out", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "fedavg" in table and "ensemble" in table and str(out) in table

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["schema_version"] == 3  # osfl.record.SCHEMA_VERSION
    recs = metrics["records"]
    assert [(r["method"], r["seed"]) for r in recs] == [
        ("fedavg", 0),
        ("ensemble", 0),
        ("fedavg", 1),
        ("ensemble", 1),
    ]
    for r in recs:
        assert 0.0 <= r["global_test_accuracy"] <= 1.0
        assert len(r["per_class_accuracy"]) == 10
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["runtime"] == "simulation"
        assert set(r["time_s"]) == {"client", "server", "eval", "total"}
        assert r["partition"]["scheme"] == "dirichlet" and len(r["partition"]["key"]) > 8
        assert r["method_config"] == (
            {"weighting": "uniform"} if r["method"] == "ensemble" else r["method_config"]
        )
    # ensemble reuses the clients fedavg trained (same seed)
    assert recs[1]["cache"] == {"hits": 2, "misses": 0}

    summary = (out / "summary.md").read_text()
    assert "| fedavg | 2 |" in summary and "±" in summary
    cfg = load_config(out / "config.yaml")  # the resolved config re-runs as is
    assert cfg.methods == ["fedavg", "ensemble"] and cfg.seeds == [0, 1]
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("method_end") == 4 and kinds.count("round") == 4
    assert kinds.count("federation") == 2
    pngs = list(out.glob("partition-*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == PNG for p in pngs)
    assert "accuracy" in (out / "run.log").read_text()


def test_sweep_over_alpha(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["run", *tiny(tmp_path), "methods=[fedavg]", "--sweep", "partition.alpha=0.5,2.0"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    recs = json.loads((out / "metrics.json").read_text())["records"]
    assert [r["point"] for r in recs] == ["partition.alpha=0.5", "partition.alpha=2.0"]
    assert [r["partition"]["params"]["alpha"] for r in recs] == [0.5, 2.0]
    assert "| setting |" in (out / "summary.md").read_text()
    assert load_config(out / "config.yaml").sweep == ["partition.alpha=0.5,2.0"]


def test_partition_command(tmp_path, capsys):
    out, plot = tmp_path / "fed.json", tmp_path / "fed.png"
    argv = ["partition", "--dataset", "digits", "--scheme", "dirichlet", "--alpha", "0.5"]
    argv += ["--clients", "3", "--seed", "1", "--out", str(out), "--plot", str(plot)]
    assert main(argv) == 0
    fed = Federation.load_json(out)
    assert fed.num_clients == 3 and fed.seed == 1 and fed.params["alpha"] == 0.5
    assert plot.read_bytes()[:8] == PNG
    assert "federation written" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse: --alpha and --classes-per-client exclude
        main([*argv, "--classes-per-client", "2"])
    assert e.value.code == 2


def test_report_table_and_curves(tmp_path):
    from osfl import report

    recs = [
        {
            "method": "fedavg",
            "seed": s,
            "global_test_accuracy": a,
            "bytes_up": 2048,
            "time_s": {"total": t},
        }
        for s, a, t in ((0, 0.5, 1.0), (1, 0.7, 3.0))
    ]
    recs.append({"method": "local", "seed": 0, "global_test_accuracy": 0.25, "bytes_up": 10})
    rows = report.summarize(recs)
    assert [(r.method, r.seeds) for r in rows] == [("fedavg", (0, 1)), ("local", (0,))]
    header, cells = report.table_rows(rows)
    assert header[:3] == ["method", "seeds", "accuracy (%)"]
    assert cells[0][:3] == ["fedavg", "2", "60.00 ± 14.14"]  # sample std of 50 and 70
    assert cells[0][3] == "2.0 KiB" and cells[0][-1] == "2.0"
    assert cells[1][2] == "25.00" and cells[1][-1] == "—"
    md = report.summary_markdown(rows, title="t", notes=["n"])
    assert "| fedavg | 2 | 60.00 ± 14.14 |" in md
    assert report.plot_curves(recs, tmp_path / "none.png") is None
    recs[0]["curve"] = [
        {"round": 0, "global_test_accuracy": 0.3},
        {"round": 1, "global_test_accuracy": 0.5},
    ]
    path = report.plot_curves(recs, tmp_path / "curves.png")
    assert path is not None and path.read_bytes()[:8] == PNG
    out = report.write_metrics(tmp_path / "m.json", recs, info={"sweep": []})
    doc = report.read_metrics(out)
    assert doc["schema_version"] == report.SCHEMA_VERSION and doc["records"] == recs


def test_checkpoint_every_saves_the_server_state_per_round(tmp_path) -> None:
    from safetensors.torch import load_file

    from osfl.cli import main

    out = tmp_path / "run"
    args = [
        "run",
        "--no-progress",
        "--out",
        str(out),
        "methods=[fedavg]",
        "method.fedavg.rounds=2",
        "train.epochs=1",
        "partition.num_clients=3",
        "cache_dir=null",
        "checkpoint_every=1",
    ]
    assert main(args) in (0, None)
    saved = sorted((out / "checkpoints").glob("fedavg-seed0*/round_*.safetensors"))
    assert [p.name for p in saved] == ["round_000.safetensors", "round_001.safetensors"]
    assert load_file(str(saved[-1]))  # a non-empty tensor dict


def test_list_method_prints_its_full_option_tree(capsys) -> None:
    assert main(["list", "--method", "dense"]) == 0
    out = capsys.readouterr().out
    assert "method.dense.<option>=<value>" in out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    for row in ("distill.lr 0.005", "distill.temperature 20.0", "generator.steps 30"):
        assert any(r.startswith(row + " ") for r in rows), row


def test_incompatible_method_fails_before_training_and_makes_no_run_dir(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    line = error_line(capsys, ["run", *tiny(tmp_path), "methods=[fedmitr]", "--out", str(out)])
    assert "fedmitr needs a ViT model" in line and "cnn_small" in line
    assert not out.exists()
    assert not list((tmp_path / "cache").glob("*.safetensors"))  # no client trained


def test_run_caches_its_federations(tmp_path) -> None:
    assert main(["run", *tiny(tmp_path), "methods=[fedavg]", "--out", str(tmp_path / "r")]) == 0
    (saved,) = (tmp_path / "cache").glob("federation-*.json")
    fed = Federation.load_json(saved)
    assert fed.scheme == "dirichlet" and len(fed.client_indices) == 2


def test_progress_board_is_live_only_on_a_terminal() -> None:
    from rich.console import Console

    from osfl.commands.common import progress_board
    from osfl.fl.progress import RichProgress

    assert isinstance(progress_board(Console(force_terminal=True), True), RichProgress)
    assert not progress_board(Console(force_terminal=True), False).enabled  # --no-progress
    assert not progress_board(Console(file=io.StringIO()), True).enabled  # piped
