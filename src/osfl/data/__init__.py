"""Data: decoded image sets in memory, their sources, batched on-device
transforms and the in-memory batch iterator (docs/design.md §1, §7).

``load_data("digits")`` / ``load_data("imagefolder:<dir>", image_size=32)``
give a :class:`DataSplits`; :class:`BatchIterator` yields uint8 batches on the
training device; :func:`build_transform` turns them into normalised,
augmented float batches.
"""

from osfl.data.federation import Federation
from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.loader import BatchIterator
from osfl.data.partition import PARTITIONS, make_federation
from osfl.data.sources import DATASETS, list_datasets, load_data, register_dataset
from osfl.data.sources.hf import from_hf
from osfl.data.transforms import (
    PIPELINES,
    ColorJitter,
    Compose,
    Normalize,
    RandomApply,
    RandomCrop,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToFloat,
    Transform,
    build_transform,
    channel_stats,
    default_transforms,
)

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "PIPELINES",
    "BatchIterator",
    "ColorJitter",
    "Compose",
    "DataSplits",
    "Federation",
    "ImageSet",
    "Normalize",
    "RandomApply",
    "RandomCrop",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToFloat",
    "Transform",
    "build_transform",
    "channel_stats",
    "default_transforms",
    "from_hf",
    "list_datasets",
    "load_data",
    "make_federation",
    "plot_class_counts",
    "register_dataset",
]


def __getattr__(name: str):
    if name == "plot_class_counts":
        # heavy: matplotlib (imported only when a plot is asked for; keeps `import osfl.data` fast)
        from osfl.data.plot import plot_class_counts

        return plot_class_counts
    raise AttributeError(f"module 'osfl.data' has no attribute {name!r}")
