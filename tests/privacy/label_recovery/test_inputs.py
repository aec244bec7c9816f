"""What a label attack reads from an Observation (``label_recovery/base.py``),
exactly: the public training recipe, the number of labels, the classifier
and its update, the gradient surrogate, the history tensors — and the exact
refusal of each bad input, naming the field (docs/privacy.md, "Running an
attack on an Observation"). A tiny linear model stands in for the
architecture (``model=``), so every number here is known by hand.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.observation import Observation
from osfl.privacy import ATTACKS, run_attack
from osfl.privacy.label_recovery.base import (
    LabelAttack,
    LabelRecoveryResult,
    LocalTraining,
    ObservationError,
    build_model,
    classifier_name,
    local_training,
    make_config,
    register_attack,
    resolve,
)


class Tiny(nn.Module):
    """``trunk`` (2 → 3, ReLU) then ``fc`` (3 → 4), the classifier."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.trunk = nn.Sequential(nn.Flatten(1), nn.Linear(2, 3), nn.ReLU())
        self.fc = nn.Linear(3, 4, bias=bias)

    def get_classifier(self) -> nn.Module:
        return self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trunk(x))


def _states(bias: bool = True) -> tuple[dict, dict]:
    torch.manual_seed(0)
    g = Tiny(bias).state_dict()
    up = {k: v + 0.25 * (i + 1) for i, (k, v) in enumerate(g.items())}
    return g, up


def _obs(train=None, **kw) -> Observation:
    g, up = _states()
    train = {"lr": 0.5, "batch_size": 2, "steps": 3} if train is None else train
    base = {
        "client_id": 3,
        "round": 1,
        "broadcast": g,
        "upload": up,
        "hparams": {"train": train},
    }
    return Observation(**{**base, **kw})


def _message(exc: pytest.ExceptionInfo) -> str:
    return str(exc.value)


# ------------------------------------------------------------------ the recipe
def test_the_recipe_is_read_as_recorded():
    train = {"lr": 0.1, "batch_size": 4, "steps": 3, "optimizer": "SGDM", "momentum": 0.9}
    obs = _obs({**train, "weight_decay": 0.01})
    obs.hparams["fl"] = {"scheme": "FedProx", "mu": 0.5}
    t = local_training(obs)
    assert t == LocalTraining(
        lr=0.1,
        batch_size=4,
        steps=3,
        optimizer="sgdm",
        momentum=0.9,
        weight_decay=0.01,
        scheme="fedprox",
        scheme_params={"mu": 0.5},
        batch_sizes=(),
    )
    assert t.total_labels == 12 and not t.nesterov
    assert obs.hparams["fl"] == {"scheme": "FedProx", "mu": 0.5}  # not consumed
    assert local_training(obs, steps=5).steps == 5


def test_top_level_hyper_parameters_are_the_fallback():
    obs = _obs(train={}, hparams={"lr": 2, "batch_size": 5, "steps": 1, "scheme": "SCAFFOLD"})
    t = local_training(obs)
    assert (t.lr, t.batch_size, t.steps, t.scheme, t.optimizer) == (2.0, 5, 1, "scaffold", "sgd")
    assert isinstance(t.lr, float) and t.momentum == 0.0 and t.weight_decay == 0.0
    assert local_training(_obs()).scheme == "fedavg"


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw", "SGD"])
def test_momentum_of_optimizers_without_it_is_zero(optimizer):
    t = local_training(
        _obs({"lr": 0.1, "batch_size": 2, "steps": 1, "optimizer": optimizer, "momentum": 0.9})
    )
    assert t.momentum == 0.0 and t.optimizer == optimizer.lower()


def test_nesterov_and_unset_values():
    t = local_training(
        _obs(
            {
                "lr": 0.1,
                "batch_size": 2,
                "steps": 1,
                "optimizer": "nesterov",
                "momentum": 0.5,
                "weight_decay": None,
            }
        )
    )
    assert t.nesterov and t.momentum == 0.5 and t.weight_decay == 0.0
    t = local_training(
        _obs({"lr": 0.1, "batch_size": 2, "steps": 1, "optimizer": "sgdm", "momentum": None})
    )
    assert t.momentum == 0.0 and not t.nesterov


@pytest.mark.parametrize(
    ("drop_last", "steps", "sizes"),
    [(False, 6, (4, 4, 2, 4, 4, 2)), (True, 4, (4, 4, 4, 4))],
)
def test_steps_from_epochs_and_the_batches_they_hold(drop_last, steps, sizes):
    """10 samples in batches of 4 for 2 epochs: the last batch of an epoch has 2
    samples, or is dropped."""
    train = {"lr": 0.1, "batch_size": 4, "epochs": 2, "drop_last": drop_last}
    t = local_training(_obs(train, upload_meta={"num_samples": 10}))
    assert (t.steps, t.batch_sizes, t.total_labels) == (steps, sizes, sum(sizes))


def test_batches_cycle_over_epochs_for_a_step_count():
    t = local_training(
        _obs({"lr": 0.1, "batch_size": 4, "steps": 5}, upload_meta={"num_samples": 10})
    )
    assert t.batch_sizes == (4, 4, 2, 4, 4) and t.total_labels == 18
    # fewer samples than one batch, dropped: no batch sizes, total from steps x batch
    t = local_training(
        _obs(
            {"lr": 0.1, "batch_size": 4, "steps": 2, "drop_last": True},
            upload_meta={"num_samples": 3},
        )
    )
    assert t.batch_sizes == () and t.total_labels == 8
    t = local_training(
        _obs({"lr": 0.1, "batch_size": 4, "steps": 2}, upload_meta={"num_samples": 0})
    )
    assert t.batch_sizes == ()


BAD_RECIPES = [
    (
        {"lr": "0.1", "batch_size": 2, "steps": 1},
        "hparams.train.lr",
        "needs a positive learning rate, got '0.1'",
    ),
    (
        {"lr": 0, "batch_size": 2, "steps": 1},
        "hparams.train.lr",
        "needs a positive learning rate, got 0",
    ),
    (
        {"lr": -1.0, "batch_size": 2, "steps": 1},
        "hparams.train.lr",
        "needs a positive learning rate, got -1.0",
    ),
    (
        {"lr": math.inf, "batch_size": 2, "steps": 1},
        "hparams.train.lr",
        "needs a positive learning rate, got inf",
    ),
    ({"batch_size": 2, "steps": 1}, "hparams.train.lr", "needs a positive learning rate, got None"),
    (
        {"lr": 0.1, "batch_size": 2.0, "steps": 1},
        "hparams.train.batch_size",
        "needs a positive integer batch size, got 2.0",
    ),
    (
        {"lr": 0.1, "batch_size": True, "steps": 1},
        "hparams.train.batch_size",
        "needs a positive integer batch size, got True",
    ),
    (
        {"lr": 0.1, "batch_size": 0, "steps": 1},
        "hparams.train.batch_size",
        "needs a positive integer batch size, got 0",
    ),
    (
        {"lr": 0.1, "batch_size": 2},
        "hparams.train.steps",
        "the number of local steps is unknown: record hparams.train.steps, or hparams.train.epochs "
        "and upload_meta.num_samples (or pass steps=)",
    ),
    (
        {"lr": 0.1, "batch_size": 2, "epochs": 1.0},
        "hparams.train.steps",
        "the number of local steps is unknown: record hparams.train.steps, or hparams.train.epochs "
        "and upload_meta.num_samples (or pass steps=)",
    ),
    (
        {"lr": 0.1, "batch_size": 2, "steps": 0},
        "hparams.train.steps",
        "local steps must be a positive integer, got 0",
    ),
    (
        {"lr": 0.1, "batch_size": 2, "steps": 1.5},
        "hparams.train.steps",
        "local steps must be a positive integer, got 1.5",
    ),
]


@pytest.mark.parametrize(("train", "fld", "msg"), BAD_RECIPES)
def test_bad_recipes_are_refused_naming_the_field(train, fld, msg):
    obs = _obs(train, upload_meta={"num_samples": 8})
    with pytest.raises(ObservationError) as e:
        local_training(obs)
    assert _message(e) == f"observation [client 3, round 1, field {fld!r}]: {msg}"
    assert e.value.field == fld


def test_unknown_epochs_without_the_sample_count():
    with pytest.raises(ObservationError, match="number of local steps is unknown"):
        local_training(_obs({"lr": 0.1, "batch_size": 2, "epochs": 1}))


def test_an_observation_error_without_a_client():
    e = ObservationError("bad", field="x.y")
    assert str(e) == "observation [field 'x.y']: bad" and e.field == "x.y"


# ------------------------------------------------------------------ results
def test_result_counts_and_labels():
    r = LabelRecoveryResult("x", np.array([2, 0, 1], dtype=np.int32))
    assert r.counts.dtype == np.int64 and r.num_labels == 3
    assert r.labels().tolist() == [0, 0, 2]
    assert r.score(np.array([0, 2, 2])) == {"cAcc": 1.0, "iAcc": pytest.approx(2 / 3)}
    assert LabelRecoveryResult("x", np.zeros(0, dtype=int)).num_labels == 0


@pytest.mark.parametrize("counts", [np.array([[1]]), np.array([1, -1]), np.array([0.5, 1.0])])
def test_result_refuses_bad_counts(counts):
    with pytest.raises(ValueError) as e:
        LabelRecoveryResult("x", counts)
    assert _message(e) == "counts must be a 1-D array of non-negative integers"


# ------------------------------------------------------------------ the model and its update
def test_resolve_reads_the_classifier_and_its_update():
    obs = _obs()
    x = resolve(obs, model=Tiny())
    g, up = _states()
    assert x.head == "fc" and x.num_classes == 4 and x.total_labels == 6
    np.testing.assert_array_equal(x.W0, g["fc.weight"].double().numpy())
    np.testing.assert_array_equal(x.b0, g["fc.bias"].double().numpy())
    np.testing.assert_allclose(x.dW, (up["fc.weight"] - g["fc.weight"]).double().numpy(), atol=1e-7)
    np.testing.assert_allclose(x.db, (up["fc.bias"] - g["fc.bias"]).double().numpy(), atol=1e-7)
    assert x.dW.dtype == np.float64
    assert not x.global_model.training and not x.local_model.training
    assert torch.equal(x.global_model.fc.weight, g["fc.weight"])
    assert torch.equal(x.local_model.fc.weight, up["fc.weight"])
    # G = -Δθ · total / (steps · lr) = -Δθ · 6 / 1.5
    G_W, G_b = x.gradient_surrogate()
    np.testing.assert_allclose(G_W, -x.dW * 4.0)
    np.testing.assert_allclose(G_b, -x.db * 4.0)


def test_history_bias_entries():
    c = torch.tensor([1.0, 2.0, 3.0, 4.0])
    obs = _obs(
        history={"history.scaffold.c.fc.bias": c, "history.feddyn.grad.fc.bias": torch.ones(2)}
    )
    x = resolve(obs, model=Tiny())
    got = x.history("history.scaffold.c")
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert x.history("history.scaffold.c_i") is None
    with pytest.raises(ObservationError) as e:
        x.history("history.feddyn.grad")
    assert _message(e) == (
        "observation [client 3, round 1, field 'history.feddyn.grad.fc.bias']: shape (2,), expected (4,)"
    )


def test_bad_tensors_are_refused_naming_the_tensor():
    g, up = _states()
    missing = {k: v for k, v in up.items() if k != "fc.bias"}
    with pytest.raises(ObservationError) as e:
        resolve(_obs(upload=missing), model=Tiny())
    assert _message(e) == (
        "observation [client 3, round 1, field 'upload[fc.bias]']: missing tensor 'fc.bias' of the model "
        "(4 tensors expected)"
    )
    with pytest.raises(ObservationError) as e:
        resolve(_obs(broadcast={**g, "fc.weight": torch.zeros(4, 2)}), model=Tiny())
    assert _message(e) == (
        "observation [client 3, round 1, field 'broadcast[fc.weight]']: shape (4, 2), expected (4, 3)"
    )
    with pytest.raises(ObservationError) as e:
        resolve(_obs(broadcast={**g, "fc.bias": [0.0] * 4}), model=Tiny())
    assert (
        _message(e)
        == "observation [client 3, round 1, field 'broadcast[fc.bias]']: shape (), expected (4,)"
    )
    bad = g["fc.bias"].clone()
    bad[1] = float("inf")
    with pytest.raises(ObservationError) as e:
        resolve(_obs(upload={**up, "fc.bias": bad}), model=Tiny())
    assert (
        _message(e)
        == "observation [client 3, round 1, field 'upload[fc.bias]']: contains NaN or Inf"
    )
    # extra tensors are ignored
    assert resolve(_obs(upload={**up, "extra": torch.ones(1)}), model=Tiny()).num_classes == 4


def test_a_classifier_without_bias_is_refused():
    g, up = _states(bias=False)
    with pytest.raises(ObservationError) as e:
        resolve(_obs(broadcast=g, upload=up), model=Tiny(bias=False))
    assert _message(e) == (
        "observation [client 3, round 1, field 'broadcast[fc.bias]']: the classifier has no bias; "
        "these attacks read the output-layer bias update"
    )


def test_the_classifier_must_be_a_linear_submodule():
    class NoHead(nn.Module):
        pass

    class ConvHead(Tiny):
        def get_classifier(self) -> nn.Module:
            return self.trunk

    class Foreign(Tiny):
        def get_classifier(self) -> nn.Module:
            return nn.Linear(3, 4)

    msg = "{} has no get_classifier() returning an nn.Linear; label-recovery attacks read the last linear layer"
    for cls in (NoHead, ConvHead):
        with pytest.raises(ConfigError) as e:
            classifier_name(cls())
        assert _message(e) == msg.format(cls.__name__)
    with pytest.raises(ConfigError) as e:
        classifier_name(Foreign())
    assert _message(e) == "get_classifier() returned a layer that is not a submodule of the model"
    assert classifier_name(Tiny()) == "fc"


def test_the_model_is_rebuilt_from_hparams_or_refused():
    obs = _obs(
        hparams={
            "train": {},
            "model": {"name": "lenet5", "kwargs": {"img_size": 16}},
            "num_classes": 7,
        }
    )
    m = build_model(obs, None)
    assert type(m).__name__ == "LeNet5" and m.fc3.out_features == 7
    template = Tiny()
    copy = build_model(obs, template)
    assert copy is not template and torch.equal(copy.fc.weight, template.fc.weight)
    want = (
        "observation [client 3, round 1, field 'hparams.model']: cannot rebuild the model: record "
        "hparams.model = {name, kwargs} and hparams.num_classes, or pass model= to the attack"
    )
    for hp in (
        {"model": {"name": "lenet5"}},
        {"model": {"kwargs": {}}, "num_classes": 7},
        {"model": "lenet5", "num_classes": 7},
        {"model": {"name": "lenet5"}, "num_classes": 7.0},
    ):
        with pytest.raises(ObservationError) as e:
            build_model(_obs(hparams=hp), None)
        assert _message(e) == want
    assert (
        build_model(
            _obs(hparams={"model": {"name": "lenet5"}, "num_classes": 3}), None
        ).fc3.out_features
        == 3
    )


# ------------------------------------------------------------------ the attack contract
def _aux(num_classes: int, n: int = 8) -> ImageSet:
    images = torch.randint(
        0, 255, (n, 1, 1, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    return ImageSet(
        images=images, labels=torch.arange(n) % num_classes, classes=tuple("abcdefgh"[:num_classes])
    )


def test_an_attack_that_needs_an_auxiliary_set_refuses_without():
    obs = _obs()
    for aux in (None, _aux(4, 0)):
        with pytest.raises(ConfigError) as e:
            run_attack("llg+", obs, aux, model=Tiny())
        assert _message(e) == "attack 'llg+' needs an auxiliary ImageSet (aux=)"
    with pytest.raises(ConfigError) as e:
        run_attack("zlg+", obs, _aux(3), model=Tiny())
    assert _message(e) == "auxiliary set has 3 classes, the model 4"
    res = run_attack("llg+", obs, _aux(4), model=Tiny())
    assert res.counts.sum() == 6 and res.attack == "llg+"


def test_counts_that_break_the_contract_are_a_bug(monkeypatch):
    class Broken(LabelAttack):
        needs_aux = False
        name = "broken"

        def _recover(self, x, aux, transform, device):
            return self.config, {}

    for counts in ([1, 1, 1, 1], [6, 0, 0]):
        with pytest.raises(RuntimeError) as e:
            Broken(np.array(counts)).recover(_obs(), model=Tiny())
        assert _message(e) == f"broken: counts {counts} do not sum to 6"
    got = Broken(np.array([6, 0, 0, 0])).recover(resolve(_obs(), model=Tiny()))
    assert got.counts.tolist() == [6, 0, 0, 0] and got.info == {}


def test_registration_and_options(monkeypatch):
    monkeypatch.setattr(ATTACKS, "_items", dict(ATTACKS._items))

    @dataclasses.dataclass(frozen=True)
    class Opts:
        a: int = 1
        b: int = 2

    @register_attack("My-Attack")
    class Mine(LabelAttack):
        Config = Opts

        def _recover(self, x, aux, transform, device):
            return np.zeros(x.num_classes), {}

    assert Mine.name == "my-attack" and ATTACKS.get("my-attack") is Mine
    assert make_config(Mine, {"b": 5}) == Opts(1, 5)
    with pytest.raises(ConfigError) as e:
        make_config(Mine, {"z": 1, "c": 2})
    assert _message(e) == "attack 'my-attack' has no option(s) c, z; valid: a, b"

    @dataclasses.dataclass(frozen=True)
    class NoOpts:
        pass

    Mine.Config = NoOpts
    with pytest.raises(ConfigError) as e:
        make_config(Mine, {"z": 1})
    assert _message(e) == "attack 'my-attack' has no option(s) z; valid: (none)"
    assert isinstance(Mine().config, NoOpts)
