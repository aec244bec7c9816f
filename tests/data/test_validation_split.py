"""Settings are chosen on a validation split carved from the training data,
never on the test set (issue "Numbers that reproduce"): ``data.validation_fraction``
holds out a class-stratified share of the train set before the clients' split,
the same for every seed, and every evaluation reports ``validation_accuracy``
(a multi-round record's best round on validation: ``tests/test_run_record.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError
from support.tiny import TINY_SPLIT


def test_the_validation_set_is_stratified_disjoint_and_the_same_for_every_seed() -> None:
    plain = assembly.load_splits(load_config(None, TINY_SPLIT))
    cfg = load_config(None, [*TINY_SPLIT, "data.validation_fraction=0.25"])
    splits, again = assembly.load_splits(cfg), assembly.load_splits(cfg)
    val = splits.validation
    assert val is not None and plain.validation is None
    assert len(splits.train) + len(val) == len(plain.train)
    counts = np.bincount(val.labels.numpy(), minlength=10)
    assert (counts == 5).all()  # 25 % of each class's 20 train images
    assert val.fingerprint() == again.validation.fingerprint()  # seeded by the data only
    train_rows = {bytes(x) for x in splits.train.images.numpy()}
    assert not any(bytes(x) in train_rows for x in val.images.numpy())  # held out, not copied
    assert splits.test.fingerprint() == plain.test.fingerprint()  # the test set is untouched


def test_a_bad_fraction_is_refused() -> None:
    with pytest.raises(ConfigError, match="validation_fraction must lie in"):
        load_config(None, ["data.validation_fraction=1.0"])
