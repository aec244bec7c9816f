"""FENS (osfl.methods.fens): the one-shot upload, the aggregator rounds, INT8 uploads."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY
from osfl.config import load_config, method_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.fl.upload import Upload, validate
from osfl.methods.fens import FENS, _int8_spec, dequantize_int8, quantize_int8


def test_int8_round_trip_is_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(8, 5, generator=g), "n": torch.tensor(3), "z": torch.zeros(4)}
    q = quantize_int8(state)
    assert q["w"].dtype == torch.int8 and q["n"].dtype == torch.int64
    back = dequantize_int8(q, state)
    step = state["w"].abs().max() / 127
    assert (back["w"] - state["w"]).abs().max() <= step / 2 + 1e-7
    assert torch.equal(back["z"], state["z"]) and torch.equal(back["n"], state["n"])
    upload = Upload(tensors=q, meta={"num_samples": 4})
    validate(upload, _int8_spec(state))
    with pytest.raises(Exception, match="w"):  # a float tensor where int8 is due is refused
        validate(Upload(tensors={**q, "w": state["w"]}, meta={"num_samples": 4}), _int8_spec(state))


def _records(tmp_path, *extra: str) -> dict[str, dict]:
    cfg = load_config(
        None,
        [
            *TINY,
            "partition.num_clients=3",
            "methods=[ensemble,fens]",
            "method.fens.rounds=3",
            "method.fens.local_epochs=5",
            "eval_every=1",
            f"cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
    )
    return {r["method"]: r for r in run_experiment(cfg)}


def test_fens_sends_the_models_once_then_only_the_aggregator(tmp_path):
    recs = _records(tmp_path)
    fens, ensemble = recs["fens"], recs["ensemble"]
    assert fens["rounds"] == 4 and len(fens["curve"]) == 4
    assert fens["global_test_accuracy"] > 0.1 + 0.2  # 10 classes: well above chance
    assert fens["uploads"] == "weights" and fens["regime"] == "scratch"
    sent = [p["bytes"] for p in fens["curve"]]
    per_round = [b - a for a, b in zip([0, *sent], sent, strict=False)]
    model_bytes = ensemble["bytes_up"] // 3
    # round 0 is the ensemble's exchange; round 1 sends all 3 models to all 3 clients
    assert per_round[0] == ensemble["bytes_up"] + ensemble["bytes_down"]
    assert per_round[2] == per_round[3]  # later rounds: the aggregator up and down only
    assert per_round[1] - per_round[2] >= 9 * model_bytes  # + the 3 models to 3 clients, once


def test_int8_uploads_about_a_quarter_of_the_bytes(tmp_path):
    recs = _records(tmp_path / "a")
    int8 = _records(tmp_path / "b", "method.fens.quantize=int8")["fens"]
    down = recs["ensemble"]["bytes_down"]  # round 0 sends the same initial model to all
    plain_up = recs["fens"]["curve"][0]["bytes"] - down
    int8_up = int8["curve"][0]["bytes"] - down
    assert plain_up == recs["ensemble"]["bytes_up"]
    assert int8_up < 0.4 * plain_up  # int8 weights + one float scale per tensor + headers
    assert int8["global_test_accuracy"] > 0.3


@pytest.mark.parametrize(
    ("bad", "words"),
    [({"rounds": 0}, "rounds"), ({"quantize": "int4"}, "quantize"), ({"lr": 0}, "lr")],
)
def test_bad_options_are_refused(bad, words):
    with pytest.raises(ConfigError, match=words):
        method_config(FENS, bad)
