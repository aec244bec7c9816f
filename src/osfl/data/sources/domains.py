"""``domains:<source spec>``: one image set seen in several styles, one domain each.

Feature non-IID (covariate shift) experiments give each client its own domain
(FedBN, Li et al. ICLR 2021; PACS, Li et al. ICCV 2017). Real domain sets load
through ``imagefolder:<dir>`` with ``<domain>/<class>/*`` trees; this source
derives named domains offline from any other source, e.g. ``domains:digits``
or ``domains:cifar10:/data/cifar-10-batches-py``:

1. the inner source is loaded with the size/cap/seed options forwarded;
2. in each split every image is assigned exactly one domain: per class, a
   seeded permutation is dealt round-robin over the domains (classes dealt one
   after another, continuing the count), so each (class, domain) cell holds
   ``n_class / K`` images ± 1 and each domain ``N / K`` ± 1;
3. each domain's images are restyled by the style of that name in
   :data:`~osfl.data.sources.domain_styles.STYLES` (default ``photo``,
   ``sketch``, ``cartoon``, ``mnistm``), in batches of torch ops on uint8;
4. ``domains`` / ``domain_names`` are recorded on train *and* test, so the
   ``natural_id`` partition makes one client per domain and accuracy can be
   read per domain.

Channels: every style works on RGB (grey inputs are replicated first) and
returns RGB, so all domains share three channels; ``channels=1`` converts the
result to luma at the end (the colour of ``cartoon``/``mnistm`` becomes grey).

Seeds: one ``seed`` drives everything through ``numpy.random.SeedSequence``
streams — the inner split (the seed itself), the domain assignment
(``[seed, ASSIGN, split]``), a domain's look (``[seed, crc32(name), 0]``:
shared by train and test and independent of which other domains are chosen)
and its per-image draws (``[seed, crc32(name), 1 + split]``).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.sources.common import check_channels, check_seed, convert_channels, make_imageset
from osfl.data.sources.domain_styles import DEFAULT_DOMAINS, STYLES
from osfl.data.sources.registry import load_data, register_dataset
from osfl.errors import ConfigError, DataError

#: Images restyled per batch (bounds the float temporaries; fixed, so draws are reproducible).
CHUNK = 1024
#: SeedSequence tag of the domain-assignment stream (above every crc32, so no style's tag).
ASSIGN = 2**32


def _seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0])


def _generator(*entropy: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*entropy))


def look_generator(name: str, seed: int) -> torch.Generator:
    """A fresh generator of domain ``name``'s look (the same for train and test)."""
    return _generator(seed, zlib.crc32(name.encode()), 0)


def draw_generator(name: str, seed: int, split: int) -> torch.Generator:
    """The generator of domain ``name``'s per-image draws in ``split`` (0 train, 1 test)."""
    return _generator(seed, zlib.crc32(name.encode()), 1 + split)


def check_domains(domains: Sequence[str] | str | None) -> tuple[str, ...]:
    """The requested domain names (a list or a comma-separated string), validated.

    Unknown, duplicate or no names are a ConfigError naming the valid choices.
    """
    valid = ", ".join(STYLES.names())
    if domains is None:
        return DEFAULT_DOMAINS
    names = domains.split(",") if isinstance(domains, str) else list(domains)
    if not all(isinstance(n, str) for n in names):
        raise ConfigError(f"domains must be domain names ({valid}), got {domains!r}")
    names = [n.strip().lower() for n in names if n.strip()]
    if not names:
        raise ConfigError(f"domains is empty; name at least one of: {valid}")
    for n in names:
        STYLES.get(n)  # unknown -> ConfigError listing the valid ones
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"domains lists {', '.join(dup)} more than once; valid: {valid}")
    return tuple(names)


def assign_domains(labels: np.ndarray, k: int, seed: int, split: int) -> np.ndarray:
    """A domain id in ``range(k)`` per sample, balanced per class (±1) and overall (±1)."""
    rng = np.random.default_rng(_seed(seed, ASSIGN, split))
    order = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    flat = np.concatenate(order) if order else np.zeros(0, np.int64)
    out = np.empty(len(labels), dtype=np.int64)
    out[flat] = np.arange(len(flat)) % k
    return out


def restyle(images: torch.Tensor, name: str, seed: int, split: int) -> torch.Tensor:
    """uint8 N×3×H×W images in the style ``name``, in chunks of :data:`CHUNK`."""
    style = STYLES.get(name)
    draw = draw_generator(name, seed, split)
    out = torch.empty_like(images)
    for s in range(0, images.shape[0], CHUNK):
        # a fresh look generator per chunk: one look for the whole domain
        out[s : s + CHUNK] = style(images[s : s + CHUNK], look_generator(name, seed), draw)
    return out


def _split(s: ImageSet, names: tuple[str, ...], seed: int, split: int, channels: int) -> ImageSet:
    if s.domains is not None:
        raise DataError(
            f"the inner source already has domains {list(s.domain_names)}; use it directly "
            f"(partition.scheme=natural_id) instead of wrapping it in 'domains:'"
        )
    dom = assign_domains(s.labels.numpy(), len(names), seed, split)
    rgb = convert_channels(s.images, 3)
    out = torch.empty_like(rgb)
    for d, name in enumerate(names):
        idx = torch.from_numpy(np.flatnonzero(dom == d))
        out[idx] = restyle(rgb[idx], name, seed, split)
    return make_imageset(
        convert_channels(out, channels),
        s.labels,
        s.classes,
        domains=dom,
        domain_names=names,
        name=f"{s.name}+domains" if s.name else "domains",
    )


@register_dataset("domains")
def load_domains(
    path: str,
    *,
    domains: Sequence[str] | str | None = None,
    seed: int = 0,
    channels: int = 3,
    image_size: int | None = None,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    test_fraction: float | None = None,
    cache_dir: str | None = None,
    source_options: Mapping[str, Any] | None = None,
) -> DataSplits:
    """Load ``path`` (an inner spec such as ``digits``) and split it into styled domains.

    ``domains``: style names (default ``photo, sketch, cartoon, mnistm``), in
    domain-id order. ``seed`` seeds the inner split and every draw here.
    ``channels``: of the output (3 by default; see the module docstring).
    ``image_size``, ``max_per_class``, ``test_max_per_class``, ``test_fraction``
    and ``cache_dir`` go to the inner source when set (``image_size`` resizes
    before styling, so edges and textures are drawn at the final size);
    ``source_options`` are any other options of the inner source (e.g.
    ``{label_mode: coarse}`` for ``cifar100``).
    """
    if not path.strip():
        raise DataError(
            "'domains' needs an inner source: write 'domains:<spec>', e.g. 'domains:digits' "
            "or 'domains:imagefolder:<dir>'"
        )
    names = check_domains(domains)
    seed = check_seed(seed)
    channels = check_channels(channels)
    named = {
        "image_size": image_size,
        "max_per_class": max_per_class,
        "test_max_per_class": test_max_per_class,
        "test_fraction": test_fraction,
        "cache_dir": cache_dir,
    }
    forwarded = {k: v for k, v in named.items() if v is not None}
    extra = dict(source_options or {})
    clash = sorted(set(extra) & ({*forwarded, "seed"}))
    if clash:
        raise DataError(
            f"source_options repeats {', '.join(clash)}; set them as options of 'domains' only"
        )
    inner = load_data(path, seed=seed, **forwarded, **extra)
    return DataSplits(
        train=_split(inner.train, names, seed, 0, channels),
        test=_split(inner.test, names, seed, 1, channels),
    )
