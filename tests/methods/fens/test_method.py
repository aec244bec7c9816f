"""FENS (osfl.methods.fens) as the authors' code runs it (sacs-epfl/fens a349903):
the held-out share its client models never train on, the aggregator trained on
those logits only, the INT8 weights, the server's FedAdam step, the bytes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from osfl import assembly
from osfl.config import load_config, method_config
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, UploadError
from osfl.experiment import run_experiment
from osfl.fl import client_training
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.server_optim import server_step
from osfl.fl.upload import Upload, validate
from osfl.methods.fens import (
    FENS,
    AggregatorLocalConfig,
    dequantize_int8,
    holdout_indices,
    int8_spec,
    quantize_int8,
    quantized_keys,
    split_client_data,
)
from osfl.methods.fens import method as fens_method
from osfl.methods.fens.aggregator import samples_seen
from support.smoke import BASE, first_aggregation
from support.tiny import TINY

# --------------------------------------------------------------------------- INT8


def test_int8_is_the_authors_per_tensor_symmetric_scheme_on_a_hand_example():
    """default_qconfig's weight observer: scale = max|w| / 127.5, round half to
    even, clamp to [-128, 127]; only conv/linear weights, biases and BN float."""
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 2))
    keys = quantized_keys(model)
    assert keys == ("0.weight", "3.weight")
    w = torch.tensor([[1.0, -0.5], [0.25, 2.55]])
    state = {**{k: v.clone() for k, v in model.state_dict().items()}, "3.weight": w}
    q = quantize_int8(state, keys)
    assert torch.allclose(q["3.weight.int8_scale"], torch.tensor([0.02]))
    # 0.25 / 0.02 = 12.5 -> 12 (half to even); 2.55 / 0.02 = 127.5 -> 128 -> clamped 127
    assert q["3.weight"].tolist() == [[50, -25], [12, 127]] and q["3.weight"].dtype == torch.int8
    back = dequantize_int8(q, keys)
    assert torch.allclose(back["3.weight"], torch.tensor([[1.0, -0.5], [0.24, 2.54]]))
    assert set(back) == set(state)
    for k in ("0.bias", "1.weight", "1.running_mean", "1.num_batches_tracked", "3.bias"):
        assert torch.equal(q[k], state[k]) and torch.equal(back[k], state[k])


def test_int8_equals_pytorch_observer_and_quantize_per_tensor():
    """The same integers and scales as the observer + quantize_per_tensor the
    authors' torch.quantization.convert uses, on random weights."""
    from torch.ao.quantization import default_qconfig

    g = torch.Generator().manual_seed(0)
    for shape in [(16, 3, 3, 3), (10, 40), (7,)]:
        w = torch.randn(*shape, generator=g) * 0.3
        obs = default_qconfig.weight()
        obs(w)
        scale, zero = obs.calculate_qparams()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = torch.quantize_per_tensor(w, float(scale), int(zero), torch.qint8)
        q = quantize_int8({"w": w}, ["w"])
        assert int(zero) == 0 and torch.allclose(q["w.int8_scale"], scale.float())
        assert torch.equal(q["w"], ref.int_repr())


def test_int8_upload_spec_refuses_float_where_int8_is_due():
    ref = {"w": torch.randn(8, 5), "b": torch.zeros(5), "n": torch.tensor(3)}
    q = quantize_int8(ref, ["w"])
    spec = int8_spec(ref, ["w"])
    validate(Upload(tensors=q, meta={"num_samples": 4}), spec)
    with pytest.raises(Exception, match="w"):
        validate(Upload(tensors={**q, "w": ref["w"]}, meta={"num_samples": 4}), spec)


# --------------------------------------------------------------------------- the held-out share


def test_holdout_is_the_authors_floor_drawn_by_a_seeded_permutation():
    train, held = holdout_indices(95, 0.1, seed=7)
    assert len(held) == 9 and len(train) == 86  # int(95 * 0.1)
    assert sorted([*train, *held]) == list(range(95))
    again_train, again_held = holdout_indices(95, 0.1, seed=7)
    assert (again_held == held).all() and (again_train == train).all()
    assert (holdout_indices(95, 0.1, seed=8)[1] != held).any()
    assert len(holdout_indices(5, 0.1, seed=0)[1]) == 1  # at least one when n >= 2
    every, same = holdout_indices(6, 0.0, seed=0)
    assert list(every) == list(same) == list(range(6))


def _smoke(tmp_path, *extra: str):
    cfg = load_config(
        None,
        [
            *BASE,
            *FENS.card.smoke,
            "method.fens.rounds=2",
            f"cache_dir={tmp_path / 'cache'}",
            "methods=[fedavg,fens]",
            *extra,
        ],
    )
    return cfg, assembly.seed_context(cfg, assembly.load_splits(cfg), cfg.seeds[0])


def _rows(images: torch.Tensor) -> list[bytes]:
    return sorted(x.numpy().tobytes() for x in images)


@pytest.mark.parametrize("batch", [False, True])
def test_held_out_samples_never_reach_client_training(tmp_path, monkeypatch, batch):
    """Every image the clients' training sees (one by one or batched), after
    FedAvg has cached models trained on all the data: each client trains on
    exactly its training share, so its held-out share never reaches training,
    and no model trained on all the data is reused."""
    cfg, ctx = _smoke(tmp_path)
    SimulationRuntime().execute(assembly.build_job(cfg, "fedavg", ctx))  # all-data models cached
    seen: list[list[bytes]] = []
    batched: list[int] = []

    def spy_local(model, data, *a, **k):
        seen.append(_rows(data.images))
        return train_local(model, data, *a, **k)

    def spy_batched(model, datas, *a, **k):
        seen.extend(_rows(d.images) for d in datas)
        batched.append(len(datas))
        return train_batched(model, datas, *a, **k)

    train_local, train_batched = client_training.train_local, client_training.train_batched
    monkeypatch.setattr(client_training, "train_local", spy_local)
    monkeypatch.setattr(client_training, "train_batched", spy_batched)
    job = assembly.build_job(cfg, "fens", ctx)
    SimulationRuntime(batch_clients=batch).execute(job)
    shares, held_rows = [], set()
    for c in range(job.run.num_clients):
        train, held = split_client_data(job.clients.data(c), 0.1, cfg.seeds[0], c)
        assert len(held) >= 1 and len(train) + len(held) == len(job.clients.data(c))
        shares.append(_rows(train.images))
        held_rows |= set(_rows(held.images)) - set(_rows(train.images))
    assert sorted(seen) == sorted(shares)
    assert bool(batched) == batch  # the batched step trains the shares, its entries are hits
    assert held_rows and not held_rows & {r for s in seen for r in s}


def test_without_a_holdout_fens_shares_fedavgs_cached_clients(tmp_path, monkeypatch):
    """The cache key is the data trained on: with ``holdout=0`` FENS trains on
    all the data, finds FedAvg's entries and trains nothing itself."""
    cfg, ctx = _smoke(tmp_path, "method.fens.holdout=0")
    SimulationRuntime().execute(assembly.build_job(cfg, "fedavg", ctx))
    calls = []
    monkeypatch.setattr(client_training, "train_local", lambda *a, **k: calls.append(a))
    SimulationRuntime().execute(assembly.build_job(cfg, "fens", ctx))
    assert calls == []


def test_the_aggregator_trains_on_the_held_out_logits_only(tmp_path, monkeypatch):
    """What each client's aggregator training receives, every round, is the K
    (dequantised INT8) client models' logits on its held-out share, in client
    order, and that share's labels."""
    cfg, ctx = _smoke(tmp_path, "cache_dir=null")
    got: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = fens_method.train_aggregator

    def spy(aggregator, logits, labels, *a, **k):
        got.append((logits.clone(), labels.clone()))
        return real(aggregator, logits, labels, *a, **k)

    monkeypatch.setattr(fens_method, "train_aggregator", spy)
    job = assembly.build_job(cfg, "fens", ctx)
    result = SimulationRuntime().execute(job)
    method, members = job.method, result.state["members"]
    assert method.int8_keys and all(
        members[c][k].dtype == torch.int8 for c in members for k in method.int8_keys
    )
    expected = []
    for c in range(job.run.num_clients):
        held = split_client_data(job.clients.data(c), 0.1, cfg.seeds[0], c)[1]
        x = job.run.eval_transform(held.images)
        with torch.no_grad():
            logits = [method.member_model(members[m]).eval()(x) for m in sorted(members)]
        expected.append((torch.stack(logits, dim=1), held.labels))
    assert len(got) == 2 * len(expected)  # two aggregator rounds
    for logits, labels in got:
        match = [e for e in expected if e[0].shape == logits.shape and torch.equal(e[1], labels)]
        assert match and torch.allclose(match[0][0], logits, atol=1e-5)


# --------------------------------------------------------------------------- the server's FedAdam


def _authors_fedadam(x: torch.Tensor, deltas: list[torch.Tensor]) -> torch.Tensor:
    """distoptim/FedAdam.py's average(), lines 83–105, transcribed."""
    m = v = None
    for d in deltas:
        m = d * (1 - 0.9) if m is None else m * 0.9 + (1 - 0.9) * d
        v = d**2 * (1 - 0.99) if v is None else v * 0.99 + (1 - 0.99) * d**2
        x = x + 0.001 * (m / (torch.sqrt(v) + 1e-3))
    return x


def test_fens_server_steps_are_the_authors_fedadam_over_rounds():
    cfg = FENS.Config().server_opt
    g = torch.Generator().manual_seed(1)
    x = {"w": torch.randn(6, generator=g, dtype=torch.float64)}
    deltas = [torch.randn(6, generator=g, dtype=torch.float64) * 0.1 for _ in range(4)]
    ref = _authors_fedadam(x["w"].clone(), deltas)
    slots = None
    for d in deltas:
        x, slots = server_step(cfg, x, {"w": x["w"] + d}, slots)
    assert torch.allclose(x["w"], ref, atol=1e-12)


def test_aggregator_weights_are_the_samples_each_step_saw():
    local = AggregatorLocalConfig()
    assert (local.batch_size, local.steps, local.lr, local.optimizer) == (128, 1, 1.0, "sgd")
    assert samples_seen(40, local) == 40 and samples_seen(300, local) == 128


def test_defaults_are_the_authors():
    cfg = FENS.Config()
    assert (cfg.holdout, cfg.quantize, cfg.rounds, cfg.hidden_per_member) == (0.1, "int8", 500, 2)
    opt = cfg.server_opt
    assert (opt.optimizer, opt.lr, opt.beta1, opt.beta2) == ("fedadam", 1e-3, 0.9, 0.99)
    assert opt.tau == 1e-3


# --------------------------------------------------------------------------- bytes and runs


def _records(tmp_path, *extra: str) -> dict[str, dict]:
    cfg = load_config(
        None,
        [
            *TINY,
            "partition.num_clients=3",
            "methods=[ensemble,fens]",
            "method.fens.rounds=3",
            "eval_every=1",
            f"cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
    )
    return {r["method"]: r for r in run_experiment(cfg)}


def _per_round(record: dict) -> list[int]:
    sent = [p["bytes"] for p in record["curve"]]
    return [b - a for a, b in zip([0, *sent], sent, strict=False)]


def test_fens_sends_the_models_once_then_only_the_aggregator(tmp_path):
    recs = _records(tmp_path, "method.fens.quantize=none")
    fens, ensemble = recs["fens"], recs["ensemble"]
    assert fens["rounds"] == 4 and len(fens["curve"]) == 4
    assert fens["uploads"] == "weights" and fens["regime"] == "scratch"
    per_round = _per_round(fens)
    # round 0: the ensemble's exchange, less the held-out tenth in no byte
    assert per_round[0] == ensemble["bytes_up"] + ensemble["bytes_down"]
    assert per_round[2] == per_round[3]  # later rounds: the aggregator up and down only
    model_bytes = ensemble["bytes_up"] // 3
    assert per_round[1] - per_round[2] >= 9 * model_bytes  # + the 3 models to 3 clients, once


def test_int8_models_go_up_and_are_relayed_in_about_a_quarter_of_the_bytes(tmp_path):
    plain_recs = _records(tmp_path / "a", "method.fens.quantize=none")
    plain, down = _per_round(plain_recs["fens"]), plain_recs["ensemble"]["bytes_down"]
    int8 = _per_round(_records(tmp_path / "b")["fens"])
    assert int8[0] - down < 0.35 * (plain[0] - down)  # uploads: int8 weights, float biases
    assert int8[1] - int8[2] < 0.35 * (plain[1] - plain[2])  # the relay in round 1


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"rounds": 0}, "rounds"),
        ({"quantize": "int4"}, "quantize"),
        ({"holdout": 1.0}, "holdout"),
        ({"local": {"lr": 0}}, "lr"),
        ({"server_opt": {"optimizer": "sgd"}}, "server optimiser"),
        ({"server_opt": {"beta2": 1.0}}, "beta2"),
    ],
)
def test_bad_options_are_refused(bad, words):
    with pytest.raises(ConfigError, match=words):
        method_config(FENS, bad)


def test_a_single_sample_client_holds_nothing_out(tmp_path):
    """It trains on its one sample; with nothing held out it has no logits, so
    its aggregator turns send nothing (an UploadError: it sits those rounds out)."""
    data = ImageSet(
        images=torch.zeros(1, 3, 2, 2, dtype=torch.uint8),
        labels=torch.zeros(1, dtype=torch.int64),
        classes=("a",),
    )
    train, held = split_client_data(data, 0.1, 0, 0)
    assert len(train) == 1 and len(held) == 0
    cfg, ctx = _smoke(tmp_path, "cache_dir=null")
    job = assembly.build_job(cfg, "fens", ctx)
    state0, uploads = first_aggregation(job)
    state = job.method.aggregate(state0, uploads, 0)
    one = job.clients.data(0).subset(np.array([0]))
    turn = ClientContext(job.run, 0, 1, torch.Generator().manual_seed(0), ClientState())
    with pytest.raises(UploadError, match="holds no data out"):
        job.method.client_update(turn, job.method.broadcast(state, 1), one)
