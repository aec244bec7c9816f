"""The tiny task every registered method runs on in the registry-wide tests
(``test_contract``, ``test_aggregate_extremes``): digits at 8 px, 3 clients,
then the method's own ``smoke`` overrides (fewer server epochs, a ViT where it
needs one). Not a test module: shared by them."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import ExperimentConfig, load_config
from osfl.data.imageset import DataSplits
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.method import METHODS, MethodWrapper
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.upload import Upload

#: The tiny task every method runs on (a method's ``smoke`` overrides come after).
BASE = (
    "data.image_size=8",
    "data.max_per_class=24",
    "partition.num_clients=3",
    "partition.alpha=0.5",
    "partition.min_partition_size=10",
    "train.epochs=8",
    "train.batch_size=16",
    "train.optimizer=sgdm",
    "train.lr=0.05",
    "cache_dir=null",
    "seeds=[0]",
)


def smoke_config(name: str, run_as: str | None = None) -> ExperimentConfig:
    """Method ``name``'s smoke experiment; ``run_as`` runs another method on the
    very same task (model, data) — the baseline it must beat."""
    methods = f"methods=[{run_as or name}]"
    return load_config(None, [*BASE, *METHODS.get(name).card.smoke, methods])


_SPLITS: dict[str, DataSplits] = {}


def smoke_context(cfg: ExperimentConfig) -> assembly.SeedContext:
    """The seed context of ``cfg`` (its data set loaded once per data config)."""
    key = repr(cfg.data)
    if key not in _SPLITS:
        _SPLITS[key] = assembly.load_splits(cfg)
    return assembly.seed_context(cfg, _SPLITS[key], cfg.seeds[0])


class _FirstAggregate(Exception):
    def __init__(self, state: Any, uploads: Mapping[int, Upload]):
        super().__init__("stopped at the first aggregation")
        self.state, self.uploads = state, dict(uploads)


class _StopAtAggregate(MethodWrapper):
    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        raise _FirstAggregate(copy.deepcopy(state), uploads)


def smoke_job(name: str, *extra: str) -> Job:
    """Method ``name``'s job on its smoke recipe over ``BASE`` (plus ``extra``
    overrides): what a mechanism test drives step by step."""
    cfg = load_config(None, [*BASE, *METHODS.get(name).card.smoke, f"methods=[{name}]", *extra])
    return assembly.build_job(cfg, name, smoke_context(cfg))


def client_ctx(job: Job, client: int, round: int, state: ClientState) -> ClientContext:
    """Client ``client``'s context in ``round``, seeded by the round."""
    return ClientContext(job.run, client, round, torch.Generator().manual_seed(round), state)


def first_aggregation(job: Job) -> tuple[Any, dict[int, Upload]]:
    """``(server state, valid uploads)`` as round 0's ``aggregate`` receives
    them, from a simulation of ``job`` stopped there."""
    try:
        SimulationRuntime().execute(dataclasses.replace(job, method=_StopAtAggregate(job.method)))
    except _FirstAggregate as got:
        return got.state, got.uploads
    raise AssertionError(f"{job.method.name} never aggregated")


def tiny_cli_args(
    tmp_path: Path, methods: str = "fedavg,ensemble", *, progress: bool = False
) -> list[str]:
    """``osfl run`` overrides for a seconds-long CLI run on 8-px digits (two
    clients, one epoch, a cache of its own under ``tmp_path``)."""
    args = [
        "data.image_size=8",
        "data.max_per_class=10",
        "partition.num_clients=2",
        "partition.alpha=1.0",
        "partition.min_partition_size=2",
        "model.kwargs={width: 4}",
        "train.epochs=1",
        "train.batch_size=16",
        f"methods=[{methods}]",
        "threads_per_client=1",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    return args if progress else [*args, "--no-progress"]


#: The small split of the ViT-client tests (EFTViT, the PEFT baselines): 8 px
#: digits, 12 images per class, 3 clients; each file adds its own recipe.
SMALL_VIT_SPLIT = (
    "data.image_size=8",
    "data.max_per_class=12",
    "partition.num_clients=3",
    "partition.alpha=0.5",
    "partition.min_partition_size=5",
)


def small_model_kwargs(name: str) -> dict[str, Any]:
    """Small but faithful settings of a registered model: the 224-px models
    run at 32 px with 2 blocks, the 518-px DINOv2 ones at 28 px (2×2 patches
    of 14) with 2 blocks, the other ViTs with 2 blocks."""
    if name.endswith("_224"):
        return {"img_size": 32, "depth": 2}
    if name.startswith("dinov2_"):
        return {"img_size": 28, "depth": 2}
    if name.startswith("vit_"):
        return {"depth": 2}
    return {}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Any:
    """One torch thread for the importing module's tests (their numbers are
    compared across runs; the thread count changes float sums), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``osfl ARGV`` refuses with (exit 2): whatever a refusal
    says, it says it in one line, never a traceback."""
    from osfl.cli import main

    capsys.readouterr()  # what earlier runs in the test logged
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]
