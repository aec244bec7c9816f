"""The data-source registry and :func:`load_data`, in a module of their own so
that the source modules (which register themselves here) and the package
that imports them do not import each other."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from osfl.data.imageset import DataSplits
from osfl.errors import DataError
from osfl.registry import Registry

Loader = Callable[..., DataSplits]

#: prefix -> loader(path, **options) -> DataSplits
DATASETS: Registry[Loader] = Registry("dataset")


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator registering a loader under ``name`` (the spec prefix)."""
    return DATASETS.register(name)


def list_datasets() -> list[str]:
    """The registered source prefixes."""
    return DATASETS.names()


def dataset_options(prefix: str) -> list[str]:
    """The keyword options the loader for ``prefix`` accepts."""
    sig = inspect.signature(DATASETS.get(prefix))
    return [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def load_data(spec: str, **options: Any) -> DataSplits:
    """Load a train/test pair from ``spec`` = ``"<source>"`` or ``"<source>:<path>"``.

    Unknown sources raise :class:`~osfl.errors.ConfigError` listing valid ones;
    unknown options, bad values and missing directories raise
    :class:`~osfl.errors.DataError` saying what to change.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(
            f"data spec must be a string like 'digits' or 'imagefolder:<dir>', got {spec!r}"
        )
    prefix, _, path = spec.strip().partition(":")
    loader = DATASETS.get(prefix.strip())
    valid = dataset_options(prefix.strip())
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise DataError(
            f"unknown option(s) {', '.join(unknown)} for data source {prefix!r}; "
            f"valid options: {', '.join(valid)}"
        )
    return loader(path, **options)
