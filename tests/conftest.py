"""Shared test set-up.

One torch thread per test process: on a 2-core machine (CI's size) OpenMP's
second thread mostly spin-waits against other work, and a fixed thread count
keeps float summation order, hence results, identical from run to run.

The ``osfl`` logger's level and handlers are put back after every test: the
CLI and the Flower app set them for a run, and a level left at INFO by one
test would put another module's INFO lines into a later test's ``caplog``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config
from osfl.data.imageset import DataSplits
from support.tiny import TINY, TINY_SCAFFOLD

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _osfl_logger_put_back() -> Iterator[None]:
    logger = logging.getLogger("osfl")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


@pytest.fixture(scope="session")
def digits_with_aux() -> tuple[Any, Any]:
    """Digits at 16 px (3 channels): the train set, and 15 test images per class
    as the label attacks' auxiliary set."""
    import numpy as np

    from osfl.data.sources import load_data

    d = load_data("digits", image_size=16, channels=3)
    y = d.test.labels.numpy()
    aux = d.test.subset(np.concatenate([np.flatnonzero(y == c)[:15] for c in range(10)]))
    return d.train, aux


@pytest.fixture(scope="module")
def tiny_data() -> tuple[Any, DataSplits]:
    cfg = load_config(None, [*TINY, "cache_dir=null"])
    return cfg, load_splits(cfg)


@pytest.fixture
def make_ctx(tiny_data, tmp_path):
    """``make_ctx(num_clients)``: a SeedContext with a fresh client cache."""
    cfg, splits = tiny_data

    def make(num_clients: int = 3) -> SeedContext:
        c = dataclasses.replace(
            cfg,
            partition=dataclasses.replace(cfg.partition, num_clients=num_clients),
            cache_dir=str(tmp_path / "cache"),
        )
        fed = build_federation(c, splits.train, 0)
        return SeedContext(splits, fed, build_run(c, splits, fed, 0))

    return make


@pytest.fixture(scope="session")
def audited_run(tmp_path_factory) -> Any:
    """A tiny run recorded with an inline audit (``TINY_SCAFFOLD``, two epochs,
    ``audit=[llg+]``): read by the audit's tests, copied by those that change it."""
    from osfl.cli import main

    out = tmp_path_factory.mktemp("audited") / "r"
    argv = ["run", *TINY_SCAFFOLD, "train.epochs=2", "audit=[llg+]", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    return out


@pytest.fixture(scope="session")
def kept_run(tmp_path_factory) -> Any:
    """One tiny run of fedavg, ensemble and local (which has no server model),
    with its kept models: read by the kept-model tests, copied by those that damage it."""
    from osfl.cli import main
    from support.smoke import tiny_cli_args

    tmp = tmp_path_factory.mktemp("kept")
    out = tmp / "run"
    assert main(["run", *tiny_cli_args(tmp, "fedavg,ensemble,local"), "--out", str(out)]) == 0
    return out
