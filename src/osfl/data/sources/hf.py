"""``hf:<dataset-id or dir>``: image-classification sets from Hugging Face
``datasets`` (Lhoest et al., 2021), an optional dependency (``pip install
'osfl[hf]'``).

A local directory written by ``DatasetDict.save_to_disk`` is read with
``load_from_disk`` (offline); any other id goes to ``load_dataset`` and so
needs internet the first time. :func:`from_hf` turns an in-memory
``DatasetDict`` (or ``Dataset``) into a :class:`DataSplits`, so code and tests
that already hold one never touch the network.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from osfl.data.imageset import DataSplits
from osfl.data.sources.common import (
    check_channels,
    check_fraction,
    check_positive_int,
    check_seed,
    make_imageset,
    pil_to_array,
    stack_hwc,
    stratified_split,
    subset_splits,
)
from osfl.data.sources.registry import register_dataset
from osfl.errors import DataError

_BATCH = 512


def _import_datasets() -> Any:
    try:
        import datasets  # optional: datasets (pip install 'osfl[hf]')
    except ImportError as e:
        raise DataError(
            "the 'hf:' source needs the Hugging Face 'datasets' package; "
            "install it with: pip install 'osfl[hf]'"
        ) from e
    return datasets


#: Column names tried when no feature has the expected type.
_USUAL_NAMES = {"image": ("image", "img"), "label": ("label", "labels", "fine_label")}


def _pick_column(ds: Any, given: str | None, feature_type: Any, what: str, option: str) -> str:
    """The ``given`` column, else the first of ``feature_type``, else a usual name."""
    cols = list(ds.column_names)
    if given is not None:
        if given not in cols:
            raise DataError(f"no {what} column {given!r}; columns are {cols}; set {option}")
        return given
    typed = [c for c in cols if isinstance(ds.features[c], feature_type)]
    named = [c for c in _USUAL_NAMES[what] if c in cols]
    if typed or named:
        return (typed or named)[0]
    raise DataError(f"cannot tell which column holds the {what}s among {cols}; set {option}=<name>")


def _decode(ds: Any, column: str, mode: str, size: int | None) -> Any:
    arrays = []
    for batch in ds.select_columns([column]).iter(batch_size=_BATCH):
        for v in batch[column]:
            im = v if isinstance(v, Image.Image) else Image.fromarray(np.asarray(v, dtype=np.uint8))
            arrays.append(pil_to_array(im, mode, size))
    return stack_hwc(arrays, f"hf column {column!r}")


def _splits(
    datasets: Any, data: Any, train_split: str, test_split: str | None
) -> tuple[Any, str | None]:
    """``(splits, test_split)``: a single ``Dataset`` is the train split with
    no test split (divided later by ``test_fraction``); a named split that is
    not there is refused."""
    if isinstance(data, datasets.Dataset):
        data, test_split = {train_split: data}, None
    elif not isinstance(data, (datasets.DatasetDict, dict)):
        raise DataError(
            f"from_hf needs a datasets.DatasetDict or Dataset, got {type(data).__name__}"
        )
    for split in (train_split, test_split):
        if split is not None and split not in data:
            raise DataError(
                f"no split {split!r}; splits are {sorted(data)}; set train_split/test_split "
                f"(test_split=None divides the train split by test_fraction)"
            )
    return data, test_split


def _class_labels(
    datasets: Any, feature: Any, raw: dict[str, list[Any]]
) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """``(classes, labels per split)``: a ``ClassLabel`` feature gives its
    names; plain values give their sorted distinct values over all splits
    (so train and test share one index)."""
    if isinstance(feature, datasets.ClassLabel):
        return tuple(feature.names), {k: np.asarray(v, dtype=np.int64) for k, v in raw.items()}
    values = sorted({v for vs in raw.values() for v in vs})
    index = {v: i for i, v in enumerate(values)}
    labels = {k: np.asarray([index[v] for v in vs], dtype=np.int64) for k, vs in raw.items()}
    return tuple(str(v) for v in values), labels


def from_hf(
    data: Any,
    *,
    image_column: str | None = None,
    label_column: str | None = None,
    train_split: str = "train",
    test_split: str | None = "test",
    test_fraction: float = 0.2,
    image_size: int | None = None,
    channels: int = 3,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    name: str = "",
) -> DataSplits:
    """A ``datasets.DatasetDict`` (or one ``Dataset``) -> :class:`DataSplits`.

    Columns default to the first ``Image`` and ``ClassLabel`` features (or
    ``image``/``img`` and ``label``). With ``test_split=None``, or a single
    ``Dataset``, the train split is divided by a seeded stratified split.
    """
    datasets = _import_datasets()
    image_size = check_positive_int("image_size", image_size)
    channels = check_channels(channels)
    test_fraction = check_fraction("test_fraction", test_fraction)
    seed = check_seed(seed)
    data, test_split = _splits(datasets, data, train_split, test_split)
    train = data[train_split]
    img_col = _pick_column(train, image_column, datasets.Image, "image", "image_column")
    lab_col = _pick_column(train, label_column, datasets.ClassLabel, "label", "label_column")
    feature = train.features[lab_col]

    parts = {"train": train} if test_split is None else {"train": train, "test": data[test_split]}
    raw = {k: list(v[lab_col]) for k, v in parts.items()}
    classes, labels = _class_labels(datasets, feature, raw)
    mode = "RGB" if channels == 3 else "L"
    images = {k: _decode(v, img_col, mode, image_size) for k, v in parts.items()}
    if test_split is None:
        tr, te = stratified_split(labels["train"], test_fraction, seed)
        images = {"train": images["train"][tr], "test": images["train"][te]}
        labels = {"train": labels["train"][tr], "test": labels["train"][te]}
    sets = {k: make_imageset(images[k], labels[k], classes, name=name) for k in ("train", "test")}
    return subset_splits(
        DataSplits(sets["train"], sets["test"]),
        check_positive_int("max_per_class", max_per_class),
        check_positive_int("test_max_per_class", test_max_per_class),
        seed,
    )


@register_dataset("hf")
def load_hf(
    path: str,
    *,
    image_column: str | None = None,
    label_column: str | None = None,
    train_split: str = "train",
    test_split: str | None = "test",
    test_fraction: float = 0.2,
    image_size: int | None = None,
    channels: int = 3,
    max_per_class: int | None = None,
    test_max_per_class: int | None = None,
    seed: int = 0,
    config_name: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DataSplits:
    """``hf:<dir>`` reads a ``save_to_disk`` directory; ``hf:<id>`` calls ``load_dataset``
    (``config_name`` and ``cache_dir`` go to it; this is the only network access)."""
    datasets = _import_datasets()
    if not path:
        raise DataError("write the spec as 'hf:<dataset-id>' or 'hf:<directory>'")
    local = Path(path).expanduser()
    try:
        if local.is_dir():
            data = datasets.load_from_disk(str(local))
        else:
            data = datasets.load_dataset(path, config_name, cache_dir=cache_dir)
    except (FileNotFoundError, ValueError, ConnectionError) as e:
        raise DataError(f"cannot load Hugging Face dataset {path!r}: {e}") from e
    return from_hf(
        data,
        image_column=image_column,
        label_column=label_column,
        train_split=train_split,
        test_split=test_split,
        test_fraction=test_fraction,
        image_size=image_size,
        channels=channels,
        max_per_class=max_per_class,
        test_max_per_class=test_max_per_class,
        seed=seed,
        name=local.name or path,
    )
