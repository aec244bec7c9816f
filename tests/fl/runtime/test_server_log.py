"""The server step's warnings reach the record (osfl.fl.runtime.server_log;
issue "Hostile peers and damaged files, round three": the Krum f-cap and
other refusal-driven changes stayed out of the record's ``warnings``)."""

from __future__ import annotations

import logging
import threading

from osfl.config import load_config
from osfl.experiment import run_experiment
from osfl.fl.aggregators import krum_tolerance
from osfl.fl.runtime.base import RoundRecord, RunResult
from osfl.fl.runtime.server_log import server_warnings


def test_warnings_of_osfl_loggers_on_this_thread_are_kept() -> None:
    other_thread: list[str] = []
    with server_warnings() as said:
        assert krum_tolerance(5, 2) == 1  # 5 uploads allow f <= 1: capped, and said
        logging.getLogger("osfl.anything").info("not a warning")
        logging.getLogger("elsewhere").warning("not osfl's")
        t = threading.Thread(target=lambda: logging.getLogger("osfl.x").warning("a client's"))
        t.start()
        t.join()
        other_thread.append("done")
    assert said == [
        "krum: 5 upload(s) in the round allow at most f=1 Byzantine (n > 2f + 2); "
        "scoring with f=1 instead of server.byzantine=2"
    ]
    with server_warnings() as after:
        logging.getLogger("osfl.fl.aggregators").warning("later")
    assert said[-1] != "later" and after == ["later"]  # the handler left with its block


def test_the_result_lists_them_by_round() -> None:
    rounds = [
        RoundRecord(r, [0], [0], {}, 1, 1, 0, 0.0, 0.0, server_warnings=w)
        for r, w in ((0, []), (1, ["krum: capped"]))
    ]
    result = RunResult(None, None, rounds, {}, 1, 1)  # type: ignore[arg-type]
    assert result.warnings == ["server (round 1): krum: capped"]
    assert rounds[1].as_dict()["server_warnings"] == ["krum: capped"]


def test_a_capped_krum_is_in_the_record_s_warnings() -> None:
    cfg = load_config(
        None,
        [
            "methods=[fedavg]",
            "server.aggregator=krum",
            "server.byzantine=2",
            "train.epochs=1",
            "data.max_per_class=20",
            "partition.alpha=1.0",
            "cache_dir=null",
            "progress=false",
        ],
    )
    (record,) = run_experiment(cfg)
    assert [w for w in record["warnings"] if w.startswith("server (round 0): krum:")]
