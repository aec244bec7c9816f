"""The generative-prior regime: the prior interface, its refusals, and priorkd
with a tiny stand-in generator (no diffusion model exists on these machines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from conftest import TINY
from osfl.config import load_config
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.methods.generative import PRIORS, load_prior, register_prior


class StandIn:
    """Class-tinted noise: a tiny class-conditional generator that records its calls."""

    calls: ClassVar[list[tuple[tuple[str, ...], int, int, int]]] = []

    def __init__(self, arg: str):
        self.arg = arg

    def generate(
        self,
        class_names: Sequence[str],
        per_class: int,
        *,
        image_size: int,
        channels: int,
        seed: int,
    ) -> ImageSet:
        StandIn.calls.append((tuple(class_names), per_class, image_size, channels))
        g = torch.Generator().manual_seed(seed)
        n = per_class * len(class_names)
        labels = torch.arange(len(class_names)).repeat_interleave(per_class)
        noise = torch.randint(0, 64, (n, channels, image_size, image_size), generator=g)
        images = (noise + (labels * 19).view(-1, 1, 1, 1)).clamp(0, 255).to(torch.uint8)
        return ImageSet(images, labels, classes=list(class_names))


@pytest.fixture(autouse=True)
def stand_in():
    if "standin" not in PRIORS:
        register_prior("standin", StandIn)
    StandIn.calls.clear()
    yield


def _cfg(tmp_path, *extra: str):
    return load_config(
        None,
        [
            *TINY,
            "methods=[priorkd]",
            "method.priorkd.distill.steps=20",
            f"cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
    )


def test_priorkd_synthesises_by_class_name_and_distils(tmp_path):
    (record,) = run_experiment(
        _cfg(tmp_path, "method.priorkd.prior=standin", "method.priorkd.per_class=7")
    )
    (names, per_class, size, channels), *more = StandIn.calls
    assert not more and per_class == 7 and (size, channels) == (8, 1)
    assert names == tuple(str(c) for c in range(10))  # the run's class names, in label order
    assert record["regime"] == "generative_prior" and record["uploads"] == "weights"
    assert 0.0 <= record["global_test_accuracy"] <= 1.0
    assert set(record["server"]["phases"]["seconds"]) == {"synthesis", "distillation"}


def test_without_a_prior_nothing_trains(tmp_path):
    with pytest.raises(ConfigError, match=r"needs a server-side image generator.*downloads none"):
        run_experiment(_cfg(tmp_path))
    trained = list((tmp_path / "cache").glob("*.safetensors"))  # client-training entries
    assert trained == []  # refused before any client trained


def test_bad_priors_are_refused_clearly():
    with pytest.raises(ConfigError, match=r"unknown prior 'sd15'.*dataset.*diffusers"):
        load_prior("sd15:/models/sd", method="priorkd")
    with pytest.raises(ConfigError, match="diffusers"):  # package missing, or no such directory
        load_prior("diffusers:/no/such/pipeline", method="priorkd")
    with pytest.raises(ConfigError, match="no class"):
        load_prior("dataset:digits", method="priorkd").generate(
            ["cat"], 2, image_size=8, channels=1, seed=0
        )


def test_dataset_prior_returns_real_images_of_each_class():
    out = load_prior("dataset:digits", method="priorkd").generate(
        ["3", "7"], 5, image_size=8, channels=1, seed=1
    )
    assert out.images.shape == (10, 1, 8, 8) and out.images.dtype == torch.uint8
    assert out.labels.tolist() == [0] * 5 + [1] * 5 and list(out.classes) == ["3", "7"]
