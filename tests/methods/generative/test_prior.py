"""The generative-prior regime: the prior interface, its refusals, and priorkd
with a tiny stand-in generator (no diffusion model exists on these machines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pytest
import torch

from osfl.config import load_config
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.experiment import run_experiment
from osfl.methods.generative import PRIORS, load_prior, register_prior
from support.tiny import TINY


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


# ---- DiffusersPrior with a stand-in `diffusers` package (no pipeline exists here)
class _Pipe:
    """DiffusionPipeline's surface: from_pretrained and a call returning PIL images
    whose pixels encode the prompt's class and the generator's first draw."""

    loaded: ClassVar[list[tuple[str, dict]]] = []
    prompts: ClassVar[list[tuple[str, int, int]]] = []

    wide = False

    @classmethod
    def from_pretrained(cls, path: str, **kw):
        cls.loaded.append((path, kw))
        return cls()

    def __call__(self, prompt: str, *, num_images_per_prompt: int, generator: torch.Generator):
        from PIL import Image

        draw = int(torch.randint(0, 200, (1,), generator=generator))
        _Pipe.prompts.append((prompt, num_images_per_prompt, draw))
        rgb = torch.zeros(4, 4, 3, dtype=torch.uint8)
        rgb[..., 0], rgb[..., 1], rgb[..., 2] = draw, len(prompt), 30
        rgb[0, 0] = torch.tensor([255, 0, 0])  # one pixel that differs between L and RGB
        if self.wide:
            rgb = torch.cat([rgb, rgb[:, :2]], dim=1)  # 4 high, 6 wide: resampled to square
        return type("Out", (), {"images": [Image.fromarray(rgb.numpy())] * num_images_per_prompt})


@pytest.fixture
def fake_diffusers(monkeypatch, tmp_path):
    import sys
    import types

    module = types.ModuleType("diffusers")
    module.DiffusionPipeline = _Pipe
    monkeypatch.setitem(sys.modules, "diffusers", module)
    _Pipe.loaded.clear()
    _Pipe.prompts.clear()
    (tmp_path / "pipe").mkdir()
    return tmp_path / "pipe"


def test_diffusers_prior_prompts_each_class_with_its_own_seed(fake_diffusers):
    from PIL import Image

    prior = load_prior(f"diffusers:{fake_diffusers}", method="priorkd")
    assert _Pipe.loaded == [(str(fake_diffusers), {"local_files_only": True})]  # never downloads
    out = prior.generate(["dog", "ship"], 2, image_size=4, channels=3, seed=3)
    g = [int(torch.randint(0, 200, (1,), generator=torch.Generator().manual_seed(3000 + k)))
         for k in (0, 1)]  # fmt: skip
    assert _Pipe.prompts == [("a photo of a dog", 2, g[0]), ("a photo of a ship", 2, g[1])]
    assert out.labels.tolist() == [0, 0, 1, 1] and list(out.classes) == ["dog", "ship"]
    assert out.images.shape == (4, 3, 4, 4) and out.images.dtype == torch.uint8
    # channels first, each channel the pipeline's own (size unchanged: no resampling)
    assert out.images[0, :, 1, 1].tolist() == [g[0], len("a photo of a dog"), 30]
    assert out.images[2, :, 1, 1].tolist() == [g[1], len("a photo of a ship"), 30]
    assert out.images[0, :, 0, 0].tolist() == [255, 0, 0]
    grey = prior.generate(["dog"], 1, image_size=4, channels=1, seed=3)
    rgb = torch.zeros(4, 4, 3, dtype=torch.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = g[0], len("a photo of a dog"), 30
    rgb[0, 0] = torch.tensor([255, 0, 0])
    expect = torch.from_numpy(np.array(Image.fromarray(rgb.numpy()).convert("L")))
    assert grey.images.shape == (1, 1, 4, 4) and torch.equal(grey.images[0, 0], expect)
    # a pipeline whose images are not square: each is resampled, rows as rows
    from osfl.methods.generative.prior import resize_uint8

    prior.pipe.wide = True
    wide = prior.generate(["dog"], 1, image_size=4, channels=3, seed=3)
    rgb = torch.cat([rgb, rgb[:, :2]], dim=1)
    assert torch.equal(wide.images[0], resize_uint8(rgb.permute(2, 0, 1), 4))


def test_diffusers_prior_without_the_package_says_so(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers -> ImportError
    with pytest.raises(ConfigError) as e:
        load_prior(f"diffusers:{tmp_path}", method="priorkd")
    assert str(e.value) == (
        "prior diffusers:<dir> needs the diffusers package (pip install diffusers), "
        "which osfl does not install"
    )


def test_diffusers_prior_refuses_a_missing_directory(fake_diffusers):
    for spec in ("diffusers:", f"diffusers:{fake_diffusers / 'absent'}"):
        with pytest.raises(ConfigError, match=r"^prior diffusers:.*: not a local pipeline directory "
                           r"\(osfl never downloads weights: save one with "
                           r"DiffusionPipeline\.save_pretrained\)$"):  # fmt: skip
            load_prior(spec, method="priorkd")
    assert _Pipe.loaded == []


def test_resize_uint8_is_antialiased_bilinear_rounded_and_clamped():
    import torch.nn.functional as F

    from osfl.methods.generative.prior import resize_uint8

    image = torch.tensor([[[0, 255], [255, 255]]], dtype=torch.uint8)  # 1x2x2
    assert resize_uint8(image, 1).tolist() == [[[191]]]  # (0 + 3 * 255) / 4 = 191.25
    big = torch.randint(0, 256, (3, 8, 8), generator=torch.Generator().manual_seed(0)).to(
        torch.uint8
    )
    out = resize_uint8(big, 3)
    ref = F.interpolate(big.float()[None], size=(3, 3), mode="bilinear", antialias=True)[0]
    assert out.shape == (3, 3, 3) and out.dtype == torch.uint8
    assert torch.equal(out, ref.round().clamp(0, 255).to(torch.uint8))
    assert not torch.equal(out, ref.to(torch.uint8))  # rounded, not truncated
    up = resize_uint8(torch.tensor([[[0, 255]]], dtype=torch.uint8).expand(1, 2, 2), 5)
    assert up.min() == 0 and up.max() == 255  # no wrap-around past the ends


def test_dataset_prior_draws_per_class_from_the_named_classes_by_seed():
    from osfl.data.sources import load_data

    source = load_data("digits", image_size=8, channels=1).train
    prior = load_prior("dataset:digits", method="priorkd")
    a = prior.generate(["7", "3"], 4, image_size=8, channels=1, seed=5)
    b = prior.generate(["7", "3"], 4, image_size=8, channels=1, seed=5)
    c = prior.generate(["7", "3"], 4, image_size=8, channels=1, seed=6)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert a.labels.tolist() == [0] * 4 + [1] * 4 and list(a.classes) == ["7", "3"]
    # every image is one of the source's images of the class it is labelled with
    names = list(source.classes)
    for img, label in zip(a.images, a.labels, strict=True):
        wanted = names.index(["7", "3"][label])
        pool = source.images[source.labels == wanted]
        assert any(torch.equal(img, p) for p in pool)
    # drawn without replacement, and a class with fewer images gives what it has
    assert len({tuple(i.flatten().tolist()) for i in a.images[:4]}) == 4
    many = prior.generate(["3"], 10_000, image_size=8, channels=1, seed=0)
    assert len(many) == int((source.labels == names.index("3")).sum())
    with pytest.raises(ConfigError, match=r"^prior dataset:<data spec> needs a data spec, "
                       r"e\.g\. dataset:digits$"):  # fmt: skip
        load_prior("dataset:", method="priorkd")
    # the images come at the size and channels asked for, as the data source gives them
    rgb = prior.generate(["7"], 2, image_size=12, channels=3, seed=5)
    assert rgb.images.shape == (2, 3, 12, 12)
    big = load_data("digits", image_size=12, channels=3).train
    assert any(torch.equal(rgb.images[0], p) for p in big.images)
