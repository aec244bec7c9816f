"""``method_train``: one method's local-training recipe on top of the run's
``train`` (e.g. EFTViT at a lower learning rate than its baselines)."""

from __future__ import annotations

import pytest

from conftest import TINY
from osfl.assembly import check_names
from osfl.config import load_config, method_train_config
from osfl.errors import ConfigError
from osfl.experiment import run_experiment


def test_override_applies_to_its_method_only(tmp_path):
    cfg = load_config(
        None,
        [
            *TINY,
            "methods=[fedavg,ensemble]",
            "train.lr=0.05",
            "method_train.ensemble.lr=0.01",
            "method_train.ensemble.epochs=2",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    assert method_train_config(cfg, "fedavg") == cfg.train
    ens = method_train_config(cfg, "ensemble")
    assert (ens.lr, ens.epochs, ens.batch_size) == (0.01, 2, cfg.train.batch_size)
    recs = {r["method"]: r for r in run_experiment(cfg)}
    assert recs["fedavg"]["train"]["lr"] == 0.05 and recs["ensemble"]["train"]["lr"] == 0.01
    assert recs["ensemble"]["train"]["epochs"] == 2
    # another recipe is another client training: the ensemble did not reuse FedAvg's clients
    assert recs["ensemble"]["cache"]["misses"] == cfg.partition.num_clients


@pytest.mark.parametrize(
    "override, needle",
    [
        ("method_train.fedavg.lrr=0.1", "unknown option 'lrr' in method_train.fedavg"),
        ("method_train.nosuch.lr=0.1", "nosuch"),
        ("method_train.fedavg.lr=fast", "method_train.fedavg"),
    ],
)
def test_bad_overrides_are_refused_before_training(override, needle):
    cfg = load_config(None, [*TINY, "methods=[fedavg]", override])
    with pytest.raises(ConfigError, match=needle):
        check_names(cfg)
