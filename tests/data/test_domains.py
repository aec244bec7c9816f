"""The ``domains:`` source: styled domains derived from digits (and a tiny RGB image
folder) — names, balanced assignment, seeds, what each style does, natural_id, bad options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from osfl.data import load_data
from osfl.data.partition import make_federation
from osfl.data.sources import list_datasets
from osfl.data.sources.domain_styles import (
    CARTOON_LEVELS,
    DEFAULT_DOMAINS,
    STYLES,
    cartoon_palette,
    luma,
    median3,
    sobel_magnitude,
    texture,
)
from osfl.data.sources.domains import draw_generator, look_generator
from osfl.errors import ConfigError, DataError

SMALL = {"image_size": 16, "max_per_class": 21, "test_max_per_class": 9}


@pytest.fixture(scope="module")
def dom():
    return load_data("domains:digits", seed=5, **SMALL)


@pytest.fixture(scope="module")
def src():
    """The same digits, undecorated, as the photo domain must show them (RGB)."""
    return load_data("digits", seed=5, channels=3, **SMALL)


def _part(s, name):
    """(images, source index) of domain ``name`` in ImageSet ``s``."""
    idx = torch.nonzero(s.domains == s.domain_names.index(name)).flatten()
    return s.images[idx], idx


# --------------------------------------------------------------------------- structure


def test_registered_and_domains_recorded(dom):
    assert "domains" in list_datasets()
    assert DEFAULT_DOMAINS == ("photo", "sketch", "cartoon", "mnistm")
    for s, n in ((dom.train, 210), (dom.test, 90)):
        assert s.domain_names == DEFAULT_DOMAINS
        assert s.domains is not None and s.domains.dtype == torch.int64
        assert s.images.shape == (n, 3, 16, 16) and s.images.dtype == torch.uint8
        assert set(s.domains.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("names", [None, ["photo", "sketch", "mnistm"], ["cartoon"]])
def test_each_image_in_one_domain_balanced_per_class(names):
    s = load_data("domains:digits", domains=names, seed=1, image_size=8, max_per_class=7)
    k = len(names or DEFAULT_DOMAINS)
    for part in (s.train, s.test):
        d = part.domains.numpy()
        assert d.shape == (len(part),) and d.min() >= 0 and d.max() < k
        table = np.zeros((part.num_classes, k), dtype=int)
        np.add.at(table, (part.labels.numpy(), d), 1)
        assert (table.max(1) - table.min(1) <= 1).all()  # per class: n/K ± 1
        np.testing.assert_array_equal(table.sum(1), part.class_counts())
        totals = np.bincount(d, minlength=k)
        assert totals.max() - totals.min() <= 1


def test_domain_order_follows_the_option():
    s = load_data("domains:digits", domains="mnistm, Photo", max_per_class=3)
    assert s.train.domain_names == s.test.domain_names == ("mnistm", "photo")


def test_same_seed_same_bytes_other_seed_differs():
    a = load_data("domains:digits", seed=2, **SMALL)
    b = load_data("domains:digits", seed=2, **SMALL)
    c = load_data("domains:digits", seed=3, **SMALL)
    for x, y in ((a.train, b.train), (a.test, b.test)):
        assert x.images.numpy().tobytes() == y.images.numpy().tobytes()
        assert torch.equal(x.domains, y.domains) and x.fingerprint() == y.fingerprint()
    assert a.train.fingerprint() != c.train.fingerprint()
    assert not torch.equal(a.train.images, c.train.images)


# --------------------------------------------------------------------------- the styles


def test_photo_is_the_source(dom, src):
    assert torch.equal(dom.train.labels, src.train.labels)
    for s, ref in ((dom.train, src.train), (dom.test, src.test)):
        imgs, idx = _part(s, "photo")
        assert len(idx) > 0 and torch.equal(imgs, ref.images[idx])


def test_sketch_is_grey_inverted_edges(dom, src):
    imgs, idx = _part(dom.train, "sketch")
    assert torch.equal(imgs[:, 0], imgs[:, 1]) and torch.equal(imgs[:, 1], imgs[:, 2])
    flat = sobel_magnitude(luma(src.train.images[idx])) == 0  # no gradient -> white paper
    assert flat.any() and (imgs[:, :1][flat] == 255).all()
    # the strongest edge of every (non-blank) image is black: normalised per image
    assert (imgs.flatten(1).min(1).values == 0).all()
    assert not torch.equal(imgs, src.train.images[idx])


def test_cartoon_posterised_coloured_and_one_palette_for_both_splits(dom):
    palette = cartoon_palette(look_generator("cartoon", 5))
    assert palette.shape == (3, CARTOON_LEVELS)
    assert (palette[:, 1:] >= palette[:, :-1]).all()  # increasing levels
    for s in (dom.train, dom.test):
        imgs, _ = _part(s, "cartoon")
        for c in range(3):
            values = set(torch.unique(imgs[:, c]).tolist())
            assert len(values) <= CARTOON_LEVELS
            assert values <= set(palette[c].tolist())
    imgs, _ = _part(dom.train, "cartoon")
    assert not torch.equal(imgs[:, 0], imgs[:, 1])  # grey digits come out tinted


def test_cartoon_inks_the_dark_side_of_edges():
    x = torch.zeros(1, 3, 12, 12, dtype=torch.uint8)
    x[..., 3:9, 3:9] = 255  # a white square on black
    g = torch.Generator()
    out = STYLES.get("cartoon")(x, look_generator("cartoon", 0), g)
    palette = cartoon_palette(look_generator("cartoon", 0))
    assert torch.equal(out[0, :, 5, 5], palette[:, -1])  # inside: the brightest colour
    assert torch.equal(out[0, :, 2, 5], palette[:, 0])  # the dark rim: ink (darkest colour)


def test_mnistm_is_texture_minus_image(dom, src):
    imgs, idx = _part(dom.train, "mnistm")
    n, _, h, w = imgs.shape
    tex = texture(n, h, w, draw_generator("mnistm", 5, 0))
    expect = (tex - src.train.images[idx].float()).abs().round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(imgs, expect)
    background = src.train.images[idx][:, 0] == 0
    assert (imgs[:, 0][background].float().std() > 10).item()  # textured, not flat
    assert not torch.equal(imgs[:, 0], imgs[:, 1])  # coloured
    assert not torch.equal(imgs[0], imgs[1])  # a fresh texture per image


def test_test_split_draws_other_textures(dom):
    a = texture(2, 16, 16, draw_generator("mnistm", 5, 0))
    b = texture(2, 16, 16, draw_generator("mnistm", 5, 1))
    assert not torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 255


def test_median3_matches_torch_median():
    x = torch.randint(
        0, 256, (4, 3, 7, 9), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    win = F.pad(x, (1, 1, 1, 1), mode="replicate").unfold(2, 3, 1).unfold(3, 3, 1)
    assert torch.equal(median3(x), win.reshape(4, 3, 7, 9, 9).median(-1).values)


# --------------------------------------------------------------------------- channels / inputs


def test_channels_option_and_rgb_inner_source(tmp_path):
    gray = load_data("domains:digits", channels=1, max_per_class=4)
    assert gray.train.images.shape[1] == 1 and gray.test.images.shape[1] == 1
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "rgb" / cls).mkdir(parents=True)
        for i in range(8):
            arr = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / "rgb" / cls / f"{i}.png")
    spec = f"imagefolder:{tmp_path / 'rgb'}"
    ref = load_data(spec, test_fraction=0.25, seed=4)
    s = load_data(f"domains:{spec}", test_fraction=0.25, seed=4)
    assert s.train.classes == ("cat", "dog") and s.train.images.shape[1:] == (3, 8, 8)
    imgs, idx = _part(s.train, "photo")
    assert torch.equal(imgs, ref.train.images[idx])  # colour photos untouched
    sk, _ = _part(s.train, "sketch")
    assert torch.equal(sk[:, 0], sk[:, 2])


def test_natural_id_gives_one_client_per_domain(dom):
    tr = dom.train
    fed = make_federation(
        tr.labels, "natural_id", 4, 0, domains=tr.domains, num_classes=tr.num_classes
    )
    assert len(fed.client_indices) == 4
    owned = [set(tr.domains.numpy()[a].tolist()) for a in fed.client_indices]
    assert all(len(o) == 1 for o in owned) and set().union(*owned) == {0, 1, 2, 3}
    assert sum(len(a) for a in fed.client_indices) == len(tr)


# --------------------------------------------------------------------------- bad options


@pytest.mark.parametrize("bad", [["photo", "oil"], "pencil", [], "", ["photo", "photo"], [3]])
def test_bad_domain_lists_are_refused_with_the_valid_names(bad):
    with pytest.raises(ConfigError, match=r"cartoon, mnistm, photo, sketch"):
        load_data("domains:digits", domains=bad)


def test_other_bad_requests(tmp_path):
    with pytest.raises(DataError, match=r"domains:<spec>"):
        load_data("domains")
    with pytest.raises(ConfigError, match=r"unknown dataset 'nope'"):
        load_data("domains:nope")
    with pytest.raises(DataError, match=r"unknown option.*valid options: domains"):
        load_data("domains:digits", levels=3)
    with pytest.raises(DataError, match=r"unknown option.*num_workers.*'digits'"):
        load_data("domains:digits", source_options={"num_workers": 2})
    with pytest.raises(DataError, match=r"source_options repeats seed"):
        load_data("domains:digits", source_options={"seed": 1})
    with pytest.raises(DataError, match=r"seed must be"):
        load_data("domains:digits", seed=-1)
    with pytest.raises(DataError, match=r"channels must be"):
        load_data("domains:digits", channels=2)
    for d in ("art", "photo"):  # a real <domain>/<class>/ tree keeps its own domains
        for c in ("a", "b"):
            (tmp_path / "pacs" / d / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(
                    tmp_path / "pacs" / d / c / f"{i}.png"
                )
    real = load_data(f"imagefolder:{tmp_path / 'pacs'}", test_fraction=0.34)
    assert real.train.domain_names == ("art", "photo")
    with pytest.raises(DataError, match=r"already has domains \['art', 'photo'\]"):
        load_data(f"domains:imagefolder:{tmp_path / 'pacs'}", test_fraction=0.34)
