"""Running an experiment (``osfl.experiment``: plan, then execute every
method and seed): the live display names the method and seed it runs, in
order; a run scores each client's own model when asked (``eval_local``), keeps a
curve of every evaluated round with its cumulative bytes and seconds, and
its convergence block from that curve."""

from __future__ import annotations

import pytest

from osfl.config import load_config
from osfl.experiment import run_experiment
from support.progress import RecordingBoard
from support.tiny import TINY, TINY_TWO_CLIENTS


def test_the_live_display_names_the_method_and_seed_it_runs() -> None:
    cfg = load_config(
        None,
        [*TINY_TWO_CLIENTS, "train.epochs=1", "methods=[fedavg]", "seeds=[0,1]", "cache_dir=null"],
    )
    board = RecordingBoard()
    run_experiment(cfg, progress=board)
    seen = [t for b in board.bars for t in (b.name, *b.descriptions) if t is not None]
    assert "fedavg, seed 0" in seen and "fedavg, seed 1" in seen
    assert seen.index("fedavg, seed 0") < seen.index("fedavg, seed 1")


def test_eval_local_and_per_round_curves(tmp_path):
    cfg = load_config(
        None,
        [
            *TINY,
            "partition.num_clients=3",
            "methods=[local,fedavg]",
            "method.fedavg={rounds: 3}",
            "eval_local=true",
            "eval_every=1",
            "target_accuracy=0.05",  # reached at once: tiny digits beat 5 % after a round
            "link_mbps=8",  # 1 MB/s: bytes / 1e6 seconds of transfer
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    local, fedavg = run_experiment(cfg)
    # each under its one name: the server predictor's (fedavg), the clients' own models' (local)
    assert len(fedavg.extra("local_test_accuracies")) == 3
    assert 0.0 <= fedavg.local_test_accuracy <= 1.0
    assert len(local.extra("client_local_test_accuracies")) == 3
    assert 0.0 <= local.mean_client_local_test_accuracy <= 1.0
    assert local.local_test_accuracy is None and "local_test_accuracies" not in local.extras
    # no server predictor: the record ranks `local` by its clients' own models' mean
    assert local["global_test_accuracy"] is None and local["mean_client_accuracy"] is not None
    assert local.ranked_accuracy == local["mean_client_accuracy"]
    assert [p["round"] for p in fedavg["curve"]] == [0, 1, 2]
    assert fedavg.curve[-1].global_test_accuracy == fedavg.global_test_accuracy
    assert fedavg["time_s"]["eval"] > 0
    # cumulative costs per evaluated round: every round sends the same model both ways
    sent = [p["bytes"] for p in fedavg["curve"]]
    assert sent == [(r + 1) * (fedavg["bytes_up"] + fedavg["bytes_down"]) // 3 for r in range(3)]
    seconds = [p["seconds"] for p in fedavg["curve"]]
    assert seconds == sorted(seconds) and seconds[0] > 0
    conv = fedavg["convergence"]
    assert conv["rounds_to_target"] == 1 and conv["link_mbps"] == 8
    last = fedavg["curve"][-1]
    assert conv["total_time_s"] == pytest.approx(last["seconds"] + last["bytes"] / 1e6, abs=1e-3)
    assert "convergence" not in local  # one round: no curve to speak of
