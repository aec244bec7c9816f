"""SCAFFOLD, FedDyn, FedDC's fixtures: digits at 16 px on five clients
(``digits``) and the 24 digits of the by-hand examples (``data``, shared with
tests/methods/fedavg/ through tests/methods/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from osfl.data.imageset import ImageSet


@pytest.fixture(scope="module")
def digits() -> tuple[ImageSet, ImageSet, Any]:
    from osfl.data.partition import make_federation
    from osfl.data.sources import load_data

    splits = load_data("digits", image_size=16, max_per_class=40)
    fed = make_federation(splits.train.labels, "dirichlet", 5, 0, alpha=1.0, num_classes=10)
    return splits.train, splits.test, fed
