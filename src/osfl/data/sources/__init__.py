"""Data sources: ``load_data("<source>[:<path or id>]", **options) -> DataSplits``.

A registry ``DATASETS`` maps the prefix before ``:`` to a loader
``loader(path: str, **options) -> DataSplits``:

- ``digits`` — scikit-learn's bundled 8×8 handwritten digits (no download);
- ``imagefolder:<dir>`` — ``train/<class>/*`` + ``test/<class>/*``, or
  ``<domain>/<class>/*`` (OfficeHome, PACS), or ``<class>/*``; cached decoded;
- ``cifar10:<dir>`` / ``cifar100:<dir>`` — the official python-pickle batches,
  read with a restricted unpickler;
- ``mnist:<dir>`` — the official idx files (gz or plain; ``mnist.py``);
- ``svhn:<dir>`` — SVHN's cropped-digit ``.mat`` files (``svhn.py``);
- ``hf:<dataset-id or dir>`` — Hugging Face ``datasets`` (optional dependency);
- ``domains:<spec>`` — any of the above split into styled domains (photo,
  sketch, cartoon, MNIST-M-like) for feature non-IID runs (``domains.py``).

``osfl data get cifar10|cifar100|mnist|svhn`` downloads the official files
(``osfl.data.download``) and prints the spec that reads them.

Options a loader does not take are refused with the list of those it does.
"""

from osfl.data.sources import cifar, digits, domains, hf, imagefolder, mnist, svhn
from osfl.data.sources.registry import (
    DATASETS,
    dataset_options,
    list_datasets,
    load_data,
    register_dataset,
)

__all__ = [
    "DATASETS",
    "cifar",
    "dataset_options",
    "digits",
    "domains",
    "hf",
    "imagefolder",
    "list_datasets",
    "load_data",
    "mnist",
    "register_dataset",
    "svhn",
]
