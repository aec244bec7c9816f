"""``threads_per_client: auto``: the count is measured once per machine and
model (1 thread or the client's share of the CPUs), cached, read back instead
of measured again, recorded in metrics.json; a damaged cache is re-measured
with a warning; explicit counts win; bad values are ConfigErrors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from osfl import assembly
from osfl.cli import main
from osfl.config import ExperimentConfig, load_config
from osfl.errors import ConfigError
from osfl.experiment import plan_experiment
from osfl.fl.runtime import threads as th
from osfl.models import create_model
from test_cli import tiny as cli_tiny

SHAPE = (1, 8, 8)


def builder():
    return create_model("cnn_small", num_classes=3, in_chans=1, img_size=8, width=4)


@pytest.fixture
def two_threads():
    """Two torch threads for the test (conftest pins one), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_rates(monkeypatch):
    """measure_images_per_s replaced by fixed rates; the calls are counted."""
    calls: list[int] = []
    rates = {1: 100.0, 2: 150.0}

    def measure(model, input_shape, batch_size, threads, **_):
        calls.append(threads)
        return rates[threads]

    monkeypatch.setattr(th, "measure_images_per_s", measure)
    monkeypatch.setattr(th, "ROUNDS", 1)  # one timing per candidate (see the median test)
    return calls, rates


def test_the_candidates_are_timed_in_turn_and_the_median_decides(monkeypatch, tmp_path):
    """One fast burst must not decide: 1 thread's outlier (400) loses to the median."""
    timings = iter([100.0, 150.0, 400.0, 150.0, 100.0, 150.0])  # 1, 2, 1, 2, 1, 2 threads
    order: list[int] = []

    def measure(model, input_shape, batch_size, threads, **_):
        order.append(threads)
        return next(timings)

    monkeypatch.setattr(th, "measure_images_per_s", measure)
    monkeypatch.setattr(th, "ROUNDS", 3)
    choice = th.choose_threads(
        nn.Linear(4, 2), (4,), 8, cache_dir=tmp_path, model_key="lin", max_threads=2
    )
    assert order == [1, 2, 1, 2, 1, 2]
    assert choice.threads == 2 and choice.images_per_s == {1: 100.0, 2: 150.0}


def choose(tmp_path: Path | None, **kw):
    kw.setdefault("model_key", "tiny-cnn")
    kw.setdefault("max_threads", 2)
    return th.choose_threads(builder, SHAPE, 8, cache_dir=tmp_path, **kw)


def test_a_measured_choice_is_one_of_the_two_candidates(tmp_path):
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    choice = choose(tmp_path)
    assert choice.threads in (1, 2) and choice.source == "measured"
    assert set(choice.images_per_s) == {1, 2} and all(r > 0 for r in choice.images_per_s.values())
    assert torch.get_num_threads() == threads  # restored
    assert torch.equal(torch.get_rng_state(), rng)  # the run's random numbers untouched
    (entry,) = json.loads((tmp_path / th.CACHE_FILE).read_text())["choices"].values()
    assert entry["threads"] == choice.threads


def test_more_threads_must_win_by_ten_percent(tmp_path, fake_rates):
    _, rates = fake_rates
    assert choose(tmp_path / "a").threads == 2
    rates[2] = 105.0  # 5 % faster: not worth the last-bit change
    assert choose(tmp_path / "b").threads == 1
    rates[2] = 90.0
    assert choose(tmp_path / "c").threads == 1


def test_a_cached_choice_is_read_not_measured(tmp_path, fake_rates, caplog):
    calls, _ = fake_rates
    first = choose(tmp_path)
    assert first.source == "measured" and calls == [1, 2]
    built = []
    with caplog.at_level(logging.INFO, logger="osfl"):
        again = th.choose_threads(
            lambda: built.append(1) or builder(),
            SHAPE,
            8,
            cache_dir=tmp_path,
            model_key="tiny-cnn",
            max_threads=2,
        )
    assert again.threads == first.threads and again.source == "cache"
    assert again.images_per_s == first.images_per_s
    assert calls == [1, 2] and built == []  # neither measured nor built
    assert f"from {tmp_path / th.CACHE_FILE}" in caplog.text
    # another key (batch size, parallel clients, model) is measured afresh
    choose(tmp_path, model_key="other")
    assert calls == [1, 2, 1, 2]


def test_without_a_cache_dir_a_process_measures_once(fake_rates):
    calls, _ = fake_rates
    key = f"memo-{id(calls)}"
    assert choose(None, model_key=key).source == "measured"
    assert choose(None, model_key=key).source == "cache"
    assert calls == [1, 2]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"choices": []}',
        "[1, 2]",
        "",
        '{"choices": "x"}',
    ],
)
def test_a_damaged_cache_is_measured_again_with_a_warning(tmp_path, fake_rates, caplog, text):
    calls, _ = fake_rates
    (tmp_path / th.CACHE_FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger="osfl"):
        choice = choose(tmp_path)
    assert choice.source == "measured" and calls == [1, 2]
    assert "damaged" in caplog.text
    doc = json.loads((tmp_path / th.CACHE_FILE).read_text())  # rewritten whole
    assert [e["threads"] for e in doc["choices"].values()] == [2]


def test_an_unusable_cache_entry_is_measured_again(tmp_path, fake_rates, caplog):
    calls, _ = fake_rates
    choose(tmp_path)
    path = tmp_path / th.CACHE_FILE
    doc = json.loads(path.read_text())
    for entry in doc["choices"].values():
        entry["threads"] = 7  # not a candidate here
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="osfl"):
        assert choose(tmp_path).threads == 2
    assert calls == [1, 2, 1, 2] and "unusable" in caplog.text


def test_nothing_to_choose_and_off_the_cpu_nothing_is_measured(tmp_path, fake_rates):
    calls, _ = fake_rates
    assert choose(tmp_path, max_threads=1) == th.ThreadChoice(1, "only candidate")
    on_gpu = choose(tmp_path, device="cuda")
    assert on_gpu.source == "device" and on_gpu.threads == torch.get_num_threads()
    assert calls == [] and not (tmp_path / th.CACHE_FILE).exists()


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("value", ["fast", "0", "-1", "2.5", "true", '"2"'])
def test_bad_values_are_refused(value):
    with pytest.raises(ConfigError, match="threads_per_client"):
        load_config(None, [f"threads_per_client={value}"])


def test_auto_is_the_default_and_numbers_and_null_load():
    assert load_config(None).threads_per_client == "auto"
    assert ExperimentConfig().threads_per_client == "auto"
    assert load_config(None, ["threads_per_client=3"]).threads_per_client == 3
    assert load_config(None, ["threads_per_client=null"]).threads_per_client is None


def tiny(tmp_path: Path) -> list[str]:
    return [*cli_tiny(tmp_path), "methods=[fedavg]", "threads_per_client=auto"]


def test_an_explicit_count_wins(tmp_path, monkeypatch, two_threads):
    def never(*a, **k):
        raise AssertionError("measured although threads_per_client was given")

    monkeypatch.setattr(th, "choose_threads", never)
    plan = plan_experiment(load_config(None, [*tiny(tmp_path), "threads_per_client=1"]))
    assert plan.cfg.threads_per_client == 1 and plan.runtime.pinned_threads() == 1


def test_auto_resolves_once_for_both_in_process_runtimes(tmp_path, fake_rates, two_threads):
    calls, _ = fake_rates
    for runtime in ("simulation", "flower"):
        cfg = load_config(None, [*tiny(tmp_path), f"runtime={runtime}"])
        plan = plan_experiment(cfg)
        assert plan.cfg.threads_per_client == 2 and plan.runtime.pinned_threads() == 2
    assert calls == [1, 2]  # the second runtime read the first one's choice
    # a runtime that pins nothing (or no run context at hand): not pinned
    cfg = load_config(None, tiny(tmp_path))
    assert assembly.resolve_threads(cfg, None).threads_per_client is None
    assert assembly.build_runtime(cfg).pinned_threads() is None


def test_osfl_run_with_auto_records_and_logs_the_choice(tmp_path, two_threads):
    out = tmp_path / "run"
    argv = ["run", *tiny(tmp_path), "threads_per_client=auto", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert torch.get_num_threads() == 2  # as before the run
    (record,) = json.loads((out / "metrics.json").read_text())["records"]
    cached = json.loads((tmp_path / "cache" / th.CACHE_FILE).read_text())["choices"]
    (entry,) = cached.values()
    assert record["threads_per_client"] == entry["threads"] in (1, 2)
    assert f"torch threads per client: {entry['threads']}" in (out / "run.log").read_text()
    assert "threads_per_client: auto" in (out / "config.yaml").read_text()  # as asked
