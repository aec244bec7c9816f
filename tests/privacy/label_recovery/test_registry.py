"""Every registered label-recovery attack (``osfl.privacy.ATTACKS``) keeps the
contract, on the same small observations (like ``tests/fl/test_contract.py`` for the
methods): counts of the right shape that sum to the number of labels the
client used, identical on a second run and on shared resolved inputs, and
better than uniformly random counts on a skewed batch by at least ``MARGIN``.

The fixture: an untrained LeNet-5 (ReLU) at 16 px, one client of 24 digits
from three classes (14 / 7 / 3), observed after one SGD step of 24 and
after three steps of 8 (lr 0.01). iDLG recovers one sample's label only, so
its inputs are six one-sample observations of the same client instead; a
newly registered attack gets the batch observations unless it is listed in
``SINGLE_SAMPLE``. Measured on this fixture: every attack scores iAcc 1.0 on
every observation; the random counts (``default_rng(0)``) score 0.25 on both
batch observations and 0.0 on average over the one-sample ones. ``MARGIN =
0.5`` is met by all with room, and fails any attack that is no better than
chance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osfl.errors import ConfigError
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import ATTACKS, run_attack
from osfl.privacy.label_recovery.base import THREAT_MODELS, resolve
from osfl.privacy.metrics import label_metrics
from osfl.privacy.simulate import model_hparams, simulate_observation

K = 10
MARGIN = 0.5
SINGLE_SAMPLE = {"idlg"}  # attacks defined for one sample (m·|B| = 1)


@pytest.fixture(scope="module")
def fixture(digits_with_aux):
    train, aux = digits_with_aux
    y = train.labels.numpy()
    rng = np.random.default_rng(0)
    picks = [
        rng.choice(np.flatnonzero(y == c), n, replace=False) for c, n in [(2, 14), (7, 7), (5, 3)]
    ]
    client = train.subset(rng.permutation(np.concatenate(picks)))

    def observe(data, steps: int, batch: int):
        torch.manual_seed(0)
        model = create_model("lenet5", num_classes=K, img_size=16)
        tc = TrainConfig(steps=steps, batch_size=batch, lr=0.01, drop_last=True)
        spec = model_hparams("lenet5", {"img_size": 16}, K)
        return simulate_observation(model, data, tc, model_spec=spec)[0]

    batches = [observe(client, 1, 24), observe(client, 3, 8)]
    singles = [observe(client.subset([i]), 1, 1) for i in range(6)]
    return {"batch": batches, "single": singles, "aux": aux}


def _inputs(name: str, fixture) -> list:
    return fixture["single" if name in SINGLE_SAMPLE else "batch"]


def _random_iacc(obs) -> float:
    truth = obs.truth["labels"].numpy()
    guess = np.bincount(np.random.default_rng(0).integers(0, K, truth.size), minlength=K)
    return label_metrics(guess, truth, num_classes=K)["iAcc"]


def test_the_registry_holds_every_published_attack():
    assert set(ATTACKS.names()) >= {"rlu", "llg+", "zlg+", "zlg+fedavg", "irlg", "idlg"}


@pytest.mark.parametrize("name", ATTACKS.names())
def test_counts_sum_to_the_labels_used(name, fixture):
    for obs in _inputs(name, fixture):
        res = run_attack(name, obs, fixture["aux"])
        assert res.attack == name
        assert res.counts.dtype == np.int64 and res.counts.shape == (K,)
        assert res.counts.min() >= 0
        assert res.counts.sum() == len(obs.truth["labels"]) == res.num_labels


@pytest.mark.parametrize("name", ATTACKS.names())
def test_same_inputs_same_counts(name, fixture):
    """A second run, and a run on inputs resolved once and shared with every
    other attack (their auxiliary forwards are memoised), give the same counts."""
    for obs in _inputs(name, fixture):
        first = run_attack(name, obs, fixture["aux"]).counts
        assert run_attack(name, obs, fixture["aux"]).counts.tolist() == first.tolist()
        shared = resolve(obs)
        for other in ATTACKS.names():
            if other in SINGLE_SAMPLE or name in SINGLE_SAMPLE:
                continue
            run_attack(other, shared, fixture["aux"])
        assert run_attack(name, shared, fixture["aux"]).counts.tolist() == first.tolist()


@pytest.mark.parametrize("name", ATTACKS.names())
def test_beats_random_counts_on_a_skewed_batch(name, fixture):
    inputs = _inputs(name, fixture)
    ours = np.mean(
        [run_attack(name, o, fixture["aux"]).score(o.truth["labels"])["iAcc"] for o in inputs]
    )
    chance = np.mean([_random_iacc(o) for o in inputs])
    assert ours >= chance + MARGIN, (ours, chance)


@pytest.mark.parametrize("name", ATTACKS.names())
def test_declares_who_can_run_it_and_what_it_needs(name, fixture):
    """A threat model from THREAT_MODELS; an attack that needs an auxiliary set
    refuses to run without one, one that does not ignores it."""
    cls = ATTACKS.get(name)
    assert cls.threat_model in THREAT_MODELS
    obs = _inputs(name, fixture)[0]
    if cls.needs_aux:
        with pytest.raises(ConfigError, match="auxiliary"):
            run_attack(name, obs)
    else:
        assert (
            run_attack(name, obs).counts.tolist()
            == run_attack(name, obs, fixture["aux"]).counts.tolist()
        )
